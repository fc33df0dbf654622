"""The commissioning report: one self-contained HTML page (no URL, nothing fetched), its verdict
first, every section, every text escaped, its figures those of a plain recomputation; opened in a
real browser with the network off, the verdict on its first screen."""

import math
import os
import re
import shutil
import subprocess
from html.parser import HTMLParser

import numpy as np
import pandas as pd
import pytest

from provided_code.apps.commission import svg
from provided_code.apps.commission.report import SECTIONS, render_report
from provided_code.metrics.anatomy import cohort_scores, fit_cohort
from provided_code.metrics.commissioning import (Z_THRESHOLD, dosimetric_outliers, dvh_curve, fit_summary, goal_table,
                                                 residuals, verdict)
from provided_code.sites import openkbp
from provided_code.tolerances import Tolerance, cells, describe

# the synthetic plans have the site's metrics: the defaults' clinical Dmean and D95 as the site's mean and D_95
TOLERANCES = (Tolerance("organs", "mean", 3.0, 0.9), Tolerance("targets", "D_95", 3.0, 0.9))

HOSTILE = '<script>alert("x")</script> & "quoted" <b>'  # in a patient id, a reason and an exclusion


def _json_rows(frame: pd.DataFrame) -> list[dict]:
    return [{key: (None if isinstance(value, float) and math.isnan(value) else value) for key, value in row.items()}
            for row in frame.to_dict(orient="records")]


def _report(patients: int = 24, hostile: bool = False, target_error: float = 0.0) -> dict:
    """A report as the orchestration fills it, from synthetic plans of OpenKBP's structures: the
    plans vary across patients, the predictions follow them within a few Gy (the targets' D_95 off
    by ``target_error`` Gy more), one plan spared its parotid much less than predicted, one
    patient's anatomy is unlike the others'; judged by :data:`TOLERANCES`."""
    site = openkbp()
    rng = np.random.default_rng(0)
    ids = [f"pt_{k + 1}" for k in range(patients)]
    if hostile:
        ids[1] = f"pt_2 {HOSTILE}"
    rows = []
    for patient in ids:
        for structure in site.structures:
            for metric in site.metrics[structure.kind][:2]:
                base = structure.prescription_gy or 30.0
                plan = base * rng.uniform(0.85, 1.05)
                rows.append({"patient": patient, "structure": structure.name, "metric": metric, "plan": plan,
                             "predicted": plan + rng.uniform(-2.0, 2.5)})
    plans = pd.DataFrame(rows)
    plans.loc[plans.metric == "D_95", "predicted"] -= target_error
    planted = (plans.patient == ids[1]) & (plans.structure == "LeftParotid") & (plans.metric == "mean")
    plans.loc[planted, "plan"] += 14.0
    table = residuals(plans)
    outliers = dosimetric_outliers(table, kinds=site)
    if hostile:
        outliers[0]["reason"] += f" {HOSTILE}"
    features = pd.DataFrame({"PTV70.volume_cc": rng.lognormal(5.5, 0.3, patients),
                             "LeftParotid.within_5mm": rng.beta(2, 5, patients),
                             "body.right_left_mm": rng.normal(400, 30, patients)}, index=ids)
    features.iloc[5] = [3 * features["PTV70.volume_cc"].max(), 0.95, 400.0]
    cohort = fit_cohort(features)
    scored = cohort_scores(cohort)
    geometric = [{"patient": patient, "score": row.score, "threshold": cohort["threshold"], "reasons": row.reasons}
                 for patient, row in scored.iterrows() if row.flagged]
    doses = {name: rng.gamma(4.0, 6.0, 400) for name in ("LeftParotid", "PTV70")}
    curves = {entry["patient"]: {name: {"plan": dvh_curve(values), "predicted": dvh_curve(values * 0.9)}
                                 for name, values in doses.items()} for entry in outliers + geometric}
    return {"model": "unet-64" + (f" {HOSTILE}" if hostile else ""), "site": site.name,
            "site_description": site.description, "created": "2025-01-01T00:00:00Z",
            "cohort": {"patients": ids, "folds": 5,
                       "excluded": [{"patient": "pt_99", "reason": "no dose.csv" + (f" {HOSTILE}" if hostile else "")}]},
            "scores": {"dose_score": 2.61, "dvh_score": 1.87},
            "summary": _json_rows(fit_summary(plans)), "plans": _json_rows(table),
            "dosimetric_outliers": outliers, "geometric_outliers": geometric,
            "geometric_scores": [{"patient": p, "score": s} for p, s in scored["score"].items()],
            "thresholds": {"z": Z_THRESHOLD, "geometric": cohort["threshold"], "alpha": cohort["alpha"]},
            "goals": goal_table(plans, site.goals), "dvh_curves": curves,
            "verdict": {**verdict(plans, [(s, m, t.within_gy, t.fraction) for s, m, t in cells(TOLERANCES, site)]),
                        "tolerances": {"source": "the defaults", "sha256": None,
                                       "rules": [t.to_dict() for t in TOLERANCES], "words": describe(TOLERANCES)}}}


class _Tables(HTMLParser):
    """The text of every cell of the table with a given id, row by row."""

    def __init__(self, table_id: str):
        super().__init__()
        self.table_id, self.inside, self.rows, self.cell = table_id, False, [], None

    def handle_starttag(self, tag, attrs):
        if tag == "table" and dict(attrs).get("id") == self.table_id:
            self.inside = True
        elif self.inside and tag == "tr":
            self.rows.append([])
        elif self.inside and tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag == "table":
            self.inside = False
        elif self.inside and tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(self.cell)
            self.cell = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def _table(page: str, table_id: str) -> list[list[str]]:
    parser = _Tables(table_id)
    parser.feed(page)
    return parser.rows


def test_the_page_fetches_nothing():
    page = render_report(_report())
    assert "http" not in page.lower()  # no URL of any scheme, not even an SVG namespace
    assert not re.search(r"""(?:src|href)\s*=\s*["']?//""", page, re.I)  # no protocol-relative URL
    assert "@import" not in page and "<link" not in page.lower() and "<script" not in page.lower()
    assert all(found.startswith("url(data:") for found in re.findall(r"url\([^)]*", page))
    assert all(href.startswith("#") for href in re.findall(r'href="([^"]*)"', page))  # in-page anchors only


def test_every_section_is_there_in_reading_order():
    page = render_report(_report())
    positions = [page.index(f'<section id="{key}">') for key, _ in SECTIONS]
    assert positions == sorted(positions)
    report = _report()
    for entry in report["dosimetric_outliers"]:
        card = page[page.index(f'id="dosimetric-{entry["patient"]}"'):]
        assert svg.escape(entry["reason"]) in card[:card.index("</div>")]
        assert "DVH, plan (solid) and prediction (dashed)" in card[:card.index("</svg>")]
    assert report["geometric_outliers"], "the planted anatomy is flagged: its card is tested"
    for entry in report["geometric_outliers"]:
        assert all(svg.escape(reason) in page for reason in entry["reasons"])
    assert page.count('<svg class="chart"') == (len(report["summary"]) * 2 + 2
                                                + len(report["dosimetric_outliers"]) + len(report["geometric_outliers"]))


def test_every_text_is_escaped():
    page = render_report(_report(hostile=True))
    assert "<script" not in page.lower()
    assert page.count(svg.escape(HOSTILE)) >= 4  # the title, the patient list, the exclusion, the reason, ...
    assert "<b>" not in re.sub(r"<b>[^<]*</b>", "", page)  # the page's own bold words close; none comes from data


def test_the_summary_and_the_goals_show_a_plain_recomputation():
    report = _report()
    page = render_report(report)
    shown = _table(page, "summary-table")[1:]
    plans = pd.DataFrame(report["plans"])
    assert len(shown) == plans.groupby(["structure", "metric"]).ngroups
    for structure, metric, n, bias, sd, mae, r2 in shown:
        rows = [(r["plan"], r["predicted"]) for r in report["plans"] if r["structure"] == structure
                and r["metric"] == metric]
        differences = [predicted - plan for plan, predicted in rows]
        mean = sum(differences) / len(rows)
        mean_plan = sum(plan for plan, _ in rows) / len(rows)
        assert int(n) == len(rows)
        assert bias == f"{mean:.2f}" and mae == f"{sum(map(abs, differences)) / len(rows):.2f}"
        assert sd == f"{math.sqrt(sum((d - mean) ** 2 for d in differences) / (len(rows) - 1)):.2f}"
        assert r2 == f"{1 - sum(d * d for d in differences) / sum((p - mean_plan) ** 2 for p, _ in rows):.3f}"
    goals = _table(page, "goals-table")[1:]
    assert [row[0] for row in goals] == [str(goal) for goal in openkbp().goals]
    for (words, n, plans_meeting, *_), goal in zip(goals, openkbp().goals):
        values = [r["plan"] for r in report["plans"] if r["structure"] == goal.structure and r["metric"] == goal.metric]
        assert int(n) == len(values)
        assert plans_meeting == (f"{100 * sum(map(goal.met_by, values)) / len(values):.0f} %" if values else "–")


def test_a_scatter_s_points_are_its_data_and_a_histogram_s_bars_its_counts():
    points = [(10.0, 12.5), (30.0, 28.0), (55.5, 60.0)]
    chart = svg.scatter(points, title="t", x_label="x", y_label="y", highlighted=[2])
    low, high = 10.0 - 0.05 * 50.0, 60.0 + 0.05 * 50.0  # both axes: the values' range, 5 % of it added each side
    area = svg.frame(250, 230, (low, high), (low, high))
    drawn = [(float(x), float(y)) for x, y in re.findall(r'<circle cx="([\d.]+)" cy="([\d.]+)"', chart)]
    for (x, y), (px, py) in zip(points, drawn):  # written with two decimals: half a hundredth of a pixel
        assert (px, py) == pytest.approx((area.x(x), area.y(y)), abs=0.005)
    assert chart.count('class="point flagged"') == 1
    values = [0.1, 0.2, 0.25, 0.9, 1.0, 1.0]
    edges, counts = svg.histogram_counts(values, bins=3)
    by_hand = [sum(1 for v in values if low <= v < high or (high == edges[-1] and v == high))
               for low, high in zip(edges, edges[1:])]
    assert counts == by_hand == [3, 0, 3]
    assert len(re.findall(r'class="bar"', svg.histogram(values, title="t", x_label="x", bins=3))) == 2


def test_a_dvh_curve_is_the_share_of_voxels_at_or_above_each_dose():
    doses = np.array([0.2, 1.0, 1.0, 2.4, 3.0])
    curve = dvh_curve(doses, step_gy=0.5)
    assert [gy for gy, _ in curve] == [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    assert [percent for _, percent in curve] == [round(100 * sum(d >= gy for d in doses) / len(doses), 3)
                                                 for gy, _ in curve]


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (Debian: apt-get install chromium); "
                                                "the page's static checks still run")
def _screenshot(tmp_path, report: dict, height: int) -> np.ndarray:
    """The page's top ``height`` pixels (1200 wide) as headless Chromium draws it, RGB, with the
    network off."""
    image = pytest.importorskip("PIL.Image", reason="Pillow reads the screenshot")
    tmp_path.mkdir(exist_ok=True)
    page = tmp_path / "report.html"
    page.write_text(render_report(report), encoding="utf-8")
    shot = tmp_path / "report.png"
    command = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--no-first-run", "--disable-sync", f"--user-data-dir={tmp_path / 'p'}",
               "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",  # nothing could be fetched
               "--hide-scrollbars", f"--window-size=1200,{height}", f"--screenshot={shot}", page.as_uri()]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "HOME": str(tmp_path)})
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    with image.open(shot) as png:
        return np.asarray(png.convert("RGB")).astype(int)


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (Debian: apt-get install chromium); "
                                                "the page's static checks still run")
def test_the_page_opens_in_a_browser_with_the_network_off(tmp_path):
    pixels = _screenshot(tmp_path, _report(), 2400).mean(axis=2)
    assert pixels.shape == (2400, 1200)
    assert pixels.std() > 10 and (pixels < 100).mean() > 0.005  # text and charts drawn, not a blank page


def _share_of_colour(pixels: np.ndarray, hex_colour: str) -> float:
    colour = np.array([int(hex_colour[k:k + 2], 16) for k in (1, 3, 5)])
    return float((np.abs(pixels - colour).max(axis=2) <= 12).mean())


@pytest.mark.skipif(_chromium() is None, reason="chromium is not installed (Debian: apt-get install chromium); "
                                                "the page's static checks still run")
def test_the_verdict_is_on_the_first_screen_in_its_colour(tmp_path):
    """A laptop's first screen (1200 × 800): a failing model's box is drawn in red (its border and
    heading, #b42318, on #fdecea), a passing one's in green (#1a7f37), and nothing of either below."""
    failing = _screenshot(tmp_path / "fail", _report(target_error=10.0), 800)
    passing = _screenshot(tmp_path / "pass", _report(), 800)
    assert _share_of_colour(failing, "#b42318") > 0.002 and _share_of_colour(failing, "#fdecea") > 0.02
    assert _share_of_colour(passing, "#1a7f37") > 0.002 and _share_of_colour(passing, "#b42318") < 0.0005
    assert _share_of_colour(failing, "#1a7f37") > 0  # its passing organs say so, in green


def test_the_calibration_shows_observed_against_nominal_coverage_and_the_validation_patients_outside():
    from provided_code.metrics import calibration

    rng = np.random.default_rng(5)
    residuals = {"PTV70": {"D95": sorted(rng.normal(0, 2, 40))}, "Brainstem": {"Dmax": sorted(rng.normal(1, 3, 40))}}
    rows = [{"patient": f"pt_{200 + p}", "structure": s, "metric": m, "plan": plan, "predicted": plan + rng.normal(0, 2)}
            for p in range(25) for s, m in (("PTV70", "D95"), ("Brainstem", "Dmax")) for plan in [rng.uniform(30, 70)]]
    held = calibration.coverage_rows(pd.DataFrame(rows), residuals)
    overall = calibration.coverage_summary(held)
    report = _report()
    report["calibration"] = {
        "split": "validation-pats", "patients": [f"pt_{200 + p}" for p in range(25)], "levels": list(calibration.LEVELS),
        "method": calibration.METHOD, "calibration_patients": 40, "threshold": 1.3,
        "in_distribution": [{"patient": "pt_200", "score": 2.4, "inside": False,
                             "reasons": [f"PTV70 volume 1,480 cc; the training cohort's largest was 610 cc {HOSTILE}"]},
                            {"patient": "pt_201", "score": 1.0, "inside": True, "reasons": []}],
        "overall": _json_rows(overall),
        "by_structure": _json_rows(calibration.coverage_summary(held, by=("structure",))),
        "by_structure_metric": _json_rows(calibration.coverage_summary(held, by=("structure", "metric")).assign(
            exact=0.9))}
    page = render_report(report)
    section = page[page.index('<section id="calibration">'):page.index('<section id="method">')]
    assert "Reliability: observed against nominal coverage" in section
    assert _table(section, "coverage-table")[1:] == [[f"{100 * r.nominal:.0f} %", f"{100 * r.observed:.0f} %",
                                                      str(r.n), f"{r.median_width:.2f}"] for r in overall.itertuples()]
    assert "1 of 2 outside the training cohort" in section and svg.escape(HOSTILE) in section and HOSTILE not in section
    assert len(_table(section, "coverage-by-metric")) == 3  # its header and the two structure-metrics
    note = render_report({**_report(), "calibration": {"note": "No scored validation predictions"}})
    assert "No scored validation predictions" in note[note.index('<section id="calibration">'):]


def _section_text(page: str, start: str, end: str) -> str:
    return page[page.index(start):page.index(end, page.index(start))]


def test_the_verdict_heads_the_page_and_names_the_failing_cells():
    report = _report(target_error=10.0)
    page = render_report(report)
    box = _section_text(page, '<div class="verdict fail" id="verdict">', "</div>")
    assert page.index('id="verdict"') < page.index("<nav>") < page.index('<section id="cohort">')
    assert "Verdict: Not fit for clinical use" in box
    failing = report["verdict"]["failing"]
    assert failing == [f"{name} D_95" for name in openkbp().targets]  # 10 Gy low: no target within 3 Gy
    assert svg.escape(report["verdict"]["words"]) in box and report["verdict"]["words"].startswith(
        "Not fit for clinical use: 3 of 10 structure-metrics fail the tolerances (PTV56 D_95: 0 of 24 patients")
    shown = _table(box, "verdict-table")
    assert shown[0] == ["structure", "metric", "tolerance", "patients within", "share", "required",
                        "largest error (Gy)", "verdict"]
    assert [(row[0], row[1], row[-1]) for row in shown[1:]] == [
        (c["structure"], c["metric"], "fails" if c["status"] == "fail" else "passes") for c in report["verdict"]["cells"]]
    assert box.count('<td class="text fail">fails</td>') == 3
    assert "the default tolerances" in box
    assert svg.escape("each organ's mean within 3 Gy of the plan for 90 % of patients") in box


def test_a_model_within_its_tolerances_says_so_and_a_cell_too_small_is_not_passed():
    page = render_report(_report())
    assert "Verdict: Within the tolerances" in page and "not fit" not in page.lower()
    small = render_report(_report(patients=8))
    box = _section_text(small, '<div class="verdict unjudged" id="verdict">', "</div>")
    assert "Verdict: Not judged: too few patients" in box and "Within the tolerances" not in box
    assert "8 patients, 10 needed" in box and box.count("too few patients</td>") == 10
    old = render_report({key: value for key, value in _report().items() if key != "verdict"})
    assert "No verdict" in old[:old.index("<nav>")]


def test_each_band_cell_is_shown_against_its_binomial_range_with_the_count_outside_and_expected():
    from provided_code.metrics import calibration

    by_pair = pd.DataFrame({"structure": ["PTV70", "PTV70", "Brainstem", "Brainstem"],
                            "metric": ["D95", "D95", "Dmax", "Dmax"], "nominal": [0.9, 0.68, 0.9, 0.68],
                            "n": [20, 20, 20, 20], "observed": [0.7, 0.7, 0.95, 1.0],
                            "median_width": [8.0, 5.0, 9.0, 6.0], "exact": [0.9, 0.68, 0.9, 0.68]})
    table, check = calibration.range_check(by_pair)
    report = _report()
    report["calibration"] = {"split": "validation-pats", "patients": [f"pt_{k}" for k in range(20)],
                             "levels": [0.68, 0.9], "method": calibration.METHOD, "calibration_patients": 40,
                             "overall": [{"nominal": 0.68, "n": 40, "observed": 0.85, "median_width": 5.5},
                                         {"nominal": 0.9, "n": 40, "observed": 0.825, "median_width": 8.5}],
                             "by_structure_metric": _json_rows(table), "range_check": check}
    page = render_report(report)
    section = page[page.index('<section id="calibration">'):page.index('<section id="method">')]
    rows = {row[0]: row for row in _table(section, "coverage-by-metric")[1:]}
    low, high = calibration.binomial_range(20, 0.9)
    assert rows["PTV70"][2:4] == ["70 % (outside)", f"{100 * low:.0f}–{100 * high:.0f} %"] == ["70 % (outside)",
                                                                                             "75–100 %"]
    assert rows["Brainstem"][2] == "95 %" and rows["Brainstem"][6] == "100 % (outside)"
    assert section.count('class="outside"') == 2
    assert "<b>2 of 4</b> cells lie outside their range; 0.2 expected by chance" in section
    assert _table(section, "range-check-table")[1:] == [["90 %", "2", "1", "0.1"], ["68 %", "2", "1", "0.1"]]
    first = page[:page.index("<nav>")]
    assert "Prediction bands: <b>2 of 4</b> structure-metric cells of the validation patients lie outside their " \
           "binomial 95 % range, 0.2 expected by chance" in first
