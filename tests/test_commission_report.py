"""The commissioning report: one self-contained HTML page (no URL, nothing fetched), every section,
every text escaped, its figures those of a plain recomputation; opened in a real browser with the
network off."""

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
                                                 residuals)
from provided_code.sites import openkbp

HOSTILE = '<script>alert("x")</script> & "quoted" <b>'  # in a patient id, a reason and an exclusion


def _json_rows(frame: pd.DataFrame) -> list[dict]:
    return [{key: (None if isinstance(value, float) and math.isnan(value) else value) for key, value in row.items()}
            for row in frame.to_dict(orient="records")]


def _report(patients: int = 24, hostile: bool = False) -> dict:
    """A report as the orchestration fills it, from synthetic plans of OpenKBP's structures: the
    plans vary across patients, the predictions follow them within a few Gy, one plan spared its
    parotid much less than predicted, one patient's anatomy is unlike the others'."""
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
            "goals": goal_table(plans, site.goals), "dvh_curves": curves}


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
def test_the_page_opens_in_a_browser_with_the_network_off(tmp_path):
    image = pytest.importorskip("PIL.Image", reason="Pillow reads the screenshot")
    page = tmp_path / "report.html"
    page.write_text(render_report(_report()), encoding="utf-8")
    shot = tmp_path / "report.png"
    command = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
               "--disable-component-update", "--no-first-run", "--disable-sync", f"--user-data-dir={tmp_path / 'p'}",
               "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",  # nothing could be fetched
               "--hide-scrollbars", "--window-size=1200,2400", f"--screenshot={shot}", page.as_uri()]
    result = subprocess.run(command, capture_output=True, text=True, timeout=120,
                            env={**os.environ, "HOME": str(tmp_path)})
    assert result.returncode == 0 and shot.is_file(), result.stderr[-2000:]
    with image.open(shot) as png:
        pixels = np.asarray(png.convert("L"))
    assert pixels.shape == (2400, 1200)
    assert pixels.std() > 10 and (pixels < 100).mean() > 0.005  # text and charts drawn, not a blank page


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
