"""The commissioning report: one self-contained HTML file (:func:`render_report`) that a physicist
reads top to bottom: first the verdict (the physicist's tolerances judged per structure-metric:
which pass, which fail, "not fit for clinical use" when any fails), then the cohort, the summary, predicted against achieved, the residuals, each
flagged patient with its reason and its DVH, and the clinical goals. CSS inline, charts inline SVG
(:mod:`.svg`), system fonts: nothing is fetched, it reads with no network.

The ``report`` dict is what ``report.json`` holds (the orchestration fills it; every number the
page shows comes from it):

``model`` (str)
    The model's name.
``site`` (str); ``site_description`` (str, optional)
    The site's name and description.
``created`` (str, optional)
    When the report was made (shown as given, e.g. an ISO 8601 time).
``cohort``
    ``{"patients": [id, ...], "folds": N, "excluded": [{"patient", "reason"}, ...]}``: the training
    patients whose out-of-fold predictions are assessed, the number of folds, and the patients left
    out and why.
``scores``
    ``{"dose_score", "dvh_score"}``: the challenge's scores of the out-of-fold predictions (Gy).
``summary``
    Rows of :func:`provided_code.metrics.commissioning.fit_summary`: ``structure``, ``metric``,
    ``n``, ``bias``, ``sd``, ``mae``, ``r2`` (None for NaN).
``plans``
    Rows of :func:`provided_code.metrics.commissioning.residuals`: ``patient``, ``structure``,
    ``metric``, ``plan``, ``predicted``, ``difference``, ``z`` (None for NaN).
``dosimetric_outliers``
    :func:`provided_code.metrics.commissioning.dosimetric_outliers`' entries: ``patient``,
    ``score``, ``structure``, ``metric``, ``plan``, ``predicted``, ``z``, ``reason``, ``also``.
``geometric_outliers``
    ``[{"patient", "score", "threshold", "reasons": [sentence, ...]}]``: the patients whose
    leave-one-out nonconformity score has a conformal p-value below the cohort's alpha against the
    other patients' (:func:`provided_code.metrics.anatomy.cohort_scores`; also ``p_value`` and
    ``feature``, the one adding most to the score).
``geometric_scores`` (optional)
    ``[{"patient", "score"}]``: every training patient's leave-one-out score (their histogram).
``thresholds``
    ``{"z": the dosimetric |z| threshold, "geometric": the score a new patient must exceed to be
    flagged (None: the cohort cannot flag), "alpha": the check's level, "geometric_note": why it
    cannot flag, when it cannot}``.
``goals``
    :func:`provided_code.metrics.commissioning.goal_table`'s entries.
``verdict`` (optional: a report made before tolerances has none, and says so)
    :func:`provided_code.metrics.commissioning.verdict`'s ``status``, ``words``, ``cells``,
    ``failing`` and ``unjudged``, and ``tolerances``: ``{"source": the file or "the defaults",
    "sha256", "rules", "words"}``.
``dvh_curves``
    ``{patient: {structure: {"plan": [[Gy, %], ...], "predicted": [[Gy, %], ...]}}}`` for the flagged
    patients (:func:`provided_code.metrics.commissioning.dvh_curve`).
``calibration`` (optional)
    The prediction bands' coverage on the validation split and its patients' in-distribution
    scores (``provided_code.apps.commission.run``'s ``_calibration``): ``split``, ``patients``,
    ``levels`` (nominal coverages), ``method``, ``calibration_patients``, ``threshold``,
    ``in_distribution`` (``[{"patient", "score", "inside", "reasons"}]``), and the rows of
    :func:`provided_code.metrics.calibration.coverage_summary` (``nominal``, ``n``, ``observed``,
    ``median_width``) ``overall``, ``by_structure`` (with ``structure``) and
    ``by_structure_metric`` (with ``structure``, ``metric`` and ``exact``, the coverage
    exchangeable patients would have, and optionally ``range_low``, ``range_high`` and
    ``outside``: the cell against its binomial 95 % range); ``range_check`` (optional: the totals of
    :func:`provided_code.metrics.calibration.range_check`, ``cells``, ``outside``, ``expected``,
    ``expected_exact`` and ``by_level``); or ``note`` (why there is none) alone.

``model``, ``site``, ``cohort``, ``summary`` and ``plans`` are required; the other sections show
"none" when absent or empty.
"""

from __future__ import annotations

import math
from typing import Iterable

from provided_code.apps.commission import svg
from provided_code.apps.commission.svg import escape
from provided_code.metrics.commissioning import CELL_VERDICTS, MIN_PATIENTS_TO_JUDGE, VERDICT_HEADS

REQUIRED = ("model", "site", "cohort", "summary", "plans")
SECTIONS = (("cohort", "The cohort"), ("summary", "How well the model predicts the plans"),
            ("scatter", "Predicted against achieved"), ("residuals", "Residual distributions"),
            ("flagged", "Flagged patients"), ("goals", "Clinical goals"),
            ("calibration", "Prediction bands and the in-distribution check"), ("method", "How to read this report"))

_STYLE = """
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", Arial, sans-serif; margin: 0;
       color: #1b1f24; background: #ffffff; line-height: 1.45; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 60px; }
h1 { font-size: 1.7em; margin: 0 0 4px; } h2 { font-size: 1.3em; margin: 36px 0 8px; border-bottom: 2px solid #d0d7de;
padding-bottom: 4px; } h3 { font-size: 1.05em; margin: 18px 0 4px; }
.lead { color: #57606a; margin: 0 0 12px; } .muted { color: #57606a; } .bad { color: #b42318; font-weight: 600; }
nav ol { columns: 2; margin: 8px 0 0; } nav a { color: #0b57d0; text-decoration: none; }
table { border-collapse: collapse; margin: 8px 0 12px; font-size: 0.9em; }
th, td { border: 1px solid #d0d7de; padding: 3px 8px; text-align: right; }
th { background: #f6f8fa; } td.text, th.text { text-align: left; }
tr.flagged td { background: #fdecea; }
.cards { display: grid; grid-template-columns: repeat(auto-fill, minmax(260px, 1fr)); gap: 10px; }
.card { border: 1px solid #d0d7de; border-radius: 6px; padding: 12px 14px; margin: 10px 0; }
.figures { display: flex; flex-wrap: wrap; gap: 14px; margin: 10px 0; }
.score { display: inline-block; border: 1px solid #d0d7de; border-radius: 6px; padding: 8px 14px; margin: 4px 10px 4px 0; }
.score b { font-size: 1.4em; display: block; }
svg.chart { background: #ffffff; font-size: 10px; }
svg .plot { fill: #fbfcfd; stroke: #8c959f; stroke-width: 1; } svg .grid { stroke: #eaeef2; stroke-width: 1; }
svg .tick { fill: #57606a; font-size: 9.5px; } svg .label { fill: #1b1f24; font-size: 10.5px; }
svg .title { fill: #1b1f24; font-size: 11.5px; font-weight: 600; } svg .legend { fill: #1b1f24; font-size: 10px; }
svg .identity { stroke: #8c959f; stroke-dasharray: 4 3; stroke-width: 1; }
svg .point { fill: #1f77b4; fill-opacity: 0.75; } svg .point.flagged { fill: #d62728; fill-opacity: 1; }
svg .bar { fill: #6e9fcf; } svg .marker { stroke: #d62728; stroke-dasharray: 4 3; stroke-width: 1.2; }
details summary { cursor: pointer; color: #0b57d0; }
.verdict { border: 2px solid #8c959f; border-radius: 8px; padding: 10px 16px; margin: 14px 0 10px; }
.verdict h2 { margin: 0 0 4px; border: none; padding: 0; font-size: 1.35em; }
.verdict.fail { border-color: #b42318; background: #fdecea; } .verdict.fail h2 { color: #b42318; }
.verdict.unjudged { border-color: #9a6700; background: #fff8e1; } .verdict.unjudged h2 { color: #7a5200; }
.verdict.pass { border-color: #1a7f37; background: #eaf6ec; } .verdict.pass h2 { color: #1a7f37; }
.verdict table { background: #ffffff; margin: 6px 0; } .verdict p { margin: 4px 0; }
td.fail { color: #b42318; font-weight: 600; } td.unjudged { color: #7a5200; font-weight: 600; }
td.pass { color: #1a7f37; } td.outside { color: #b42318; font-weight: 600; }
"""


def render_report(report: dict) -> str:
    """The report as one self-contained HTML page (module docstring: the ``report`` dict)."""
    missing = [key for key in REQUIRED if key not in report]
    if missing:
        raise ValueError(f"Invalid `report`. Expected the keys {', '.join(REQUIRED)}. Received none for "
                         f"{', '.join(missing)}")
    title = f"Model commissioning: {report['model']}"
    body = [f"<header><h1>{escape(title)}</h1>", f'<p class="lead">{escape(_subtitle(report))}</p>',
            _verdict(report), '<nav><ol>' + "".join(f'<li><a href="#{key}">{escape(name)}</a></li>' for key, name in SECTIONS)
            + "</ol></nav></header>",
            _section("cohort", _cohort(report)), _section("summary", _summary(report)),
            _section("scatter", _scatter(report)), _section("residuals", _residuals(report)),
            _section("flagged", _flagged(report)), _section("goals", _goals(report)),
            _section("calibration", _calibration(report)), _section("method", _method(report))]
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{escape(title)}</title>"
            f"<style>{_STYLE}</style></head><body><main>" + "\n".join(body) + "</main></body></html>\n")


def _number(key: str) -> int:
    return [k for k, _ in SECTIONS].index(key) + 1


def _section(key: str, content: str) -> str:
    number = _number(key)
    name = dict(SECTIONS)[key]
    return f'<section id="{key}"><h2>{number}. {escape(name)}</h2>{content}</section>'


def _subtitle(report: dict) -> str:
    cohort = report["cohort"]
    parts = [f"site {report['site']}", f"{len(cohort.get('patients', []))} patients",
             f"{cohort.get('folds', '?')} folds, out-of-fold predictions"]
    if report.get("created"):
        parts.append(f"made {report['created']}")
    return "; ".join(parts)


# -- the verdict, on the first screen ---------------------------------------------------------------

_VERDICT_CLASS = {"fail": "fail", "not judged": "unjudged", "pass": "pass"}


def _verdict(report: dict) -> str:
    """The verdict box: the tolerances judged per structure-metric, the failing cells named, and
    the bands' calibration in one line."""
    found = report.get("verdict")
    if not found:
        return ('<div class="verdict unjudged" id="verdict"><h2>No verdict</h2><p>This report was made before '
                'commissioning judged the model by tolerances: commission it again (openkbp-commission) for its '
                'verdict.</p></div>')
    status = found.get("status")
    tolerances = found.get("tolerances") or {}
    source = tolerances.get("source") or "the defaults"
    judged_by = ("the default tolerances" if source == "the defaults" else f"the tolerances of {source}"
                 + (f" (SHA-256 {tolerances['sha256'][:12]}…)" if tolerances.get("sha256") else ""))
    parts = [f'<div class="verdict {_VERDICT_CLASS.get(status, "unjudged")}" id="verdict">'
             f'<h2>Verdict: {escape(VERDICT_HEADS.get(status, str(status)))}</h2>'
             f'<p id="verdict-words">{escape(found.get("words", ""))}</p>'
             f'<p class="muted">Judged on the out-of-fold predictions by {escape(judged_by)}: '
             f'{escape(tolerances.get("words", ""))}. A structure-metric is judged on at least {MIN_PATIENTS_TO_JUDGE} '
             f'patients, and at least 1/(1 − the share required).</p>']
    rows = []
    for cell in found.get("cells") or []:
        rows.append(([cell.get("structure"), cell.get("metric"), f"{_fmt(cell.get('within_gy'), 1)} Gy",
                      f"{cell.get('within')} of {cell.get('n')}", _percent(cell.get("observed")),
                      _percent(cell.get("fraction")), _fmt(cell.get("worst"), 1),
                      CELL_VERDICTS.get(cell.get("status"), cell.get("status"))],
                     {7: _VERDICT_CLASS.get({"too few": "not judged"}.get(cell.get("status"), cell.get("status")), "")}))
    if rows:
        parts.append(_table(["structure", "metric", "tolerance", "patients within", "share", "required",
                             "largest error (Gy)", "verdict"], [row for row, _ in rows], text_columns=(0, 1, 7),
                            table_id="verdict-table", cell_classes=[classes for _, classes in rows]))
    check = (report.get("calibration") or {}).get("range_check")
    if check:
        parts.append(f'<p id="verdict-bands">Prediction bands: <b>{escape(check.get("outside"))} of '
                     f'{escape(check.get("cells"))}</b> structure-metric cells of the validation patients lie outside '
                     f'their binomial 95 % range, {escape(_fmt(check.get("expected"), 1))} expected by chance (5 % of '
                     f'the cells; section {_number("calibration")}).</p>')
    return "".join(parts) + "</div>"


# -- sections --------------------------------------------------------------------------------------

def _cohort(report: dict) -> str:
    cohort = report["cohort"]
    patients = [str(p) for p in cohort.get("patients", [])]
    excluded = cohort.get("excluded") or []
    description = str(report.get("site_description") or "").strip()
    parts = [f"<p>Site <b>{escape(report['site'])}</b>" + (f": {escape(description)}" if description else "")
             + ("" if description.endswith((".", "!", "?")) else ".") + "</p>",
             f"<p><b>{len(patients)}</b> training patients, each predicted by the model of the fold that did not "
             f"train on it (<b>{escape(cohort.get('folds', '?'))}</b> folds): every figure below compares a plan "
             f"with a prediction made without it.</p>",
             f"<details><summary>The {len(patients)} patients</summary><p>{escape(', '.join(patients))}</p></details>"]
    if excluded:
        parts.append(f"<h3>Excluded patients ({len(excluded)})</h3>")
        parts.append(_table(["patient", "reason"], [[e.get("patient"), e.get("reason")] for e in excluded],
                            text_columns=(0, 1)))
    else:
        parts.append("<p class=\"muted\">No patient was excluded.</p>")
    return "".join(parts)


def _summary(report: dict) -> str:
    scores = report.get("scores") or {}
    parts = ['<div>'] + [f'<span class="score">{escape(name)}<b>{escape(_fmt(scores.get(key), 3))} Gy</b></span>'
                         for key, name in (("dose_score", "Dose score (out-of-fold)"),
                                           ("dvh_score", "DVH score (out-of-fold)"))] + ["</div>"]
    parts.append("<p>Per structure and metric, across patients: <b>bias</b> the mean of predicted − plan (Gy; "
                 "positive: the model predicts more dose than the plans had), <b>SD</b> the standard deviation of "
                 "those differences, <b>MAE</b> their mean absolute value, <b>R²</b> the share of the plans' "
                 "variation across patients that the predictions explain (– when the plans do not vary).</p>")
    rows = [[row.get("structure"), row.get("metric"), row.get("n"), _fmt(row.get("bias"), 2), _fmt(row.get("sd"), 2),
             _fmt(row.get("mae"), 2), _fmt(row.get("r2"), 3)] for row in report["summary"]]
    parts.append(_table(["structure", "metric", "n", "bias (Gy)", "SD (Gy)", "MAE (Gy)", "R²"], rows,
                        text_columns=(0, 1), table_id="summary-table"))
    return "".join(parts)


def _by_pair(report: dict) -> dict[tuple[str, str], list[dict]]:
    """The plans' rows per (structure, metric), in the summary's order, then any only the plans have."""
    pairs = {(row["structure"], row["metric"]): [] for row in report["summary"]}
    for row in report["plans"]:
        pairs.setdefault((row["structure"], row["metric"]), []).append(row)
    return pairs


def _flagged_rows(report: dict) -> set[tuple[str, str, str]]:
    """(patient, structure, metric) of every row beyond the dosimetric threshold."""
    flagged = set()
    for entry in report.get("dosimetric_outliers") or []:
        flagged.add((entry["patient"], entry["structure"], entry["metric"]))
        flagged.update((entry["patient"], also["structure"], also["metric"]) for also in entry.get("also", []))
    return flagged


def _scatter(report: dict) -> str:
    flagged = _flagged_rows(report)
    charts = []
    for (structure, metric), rows in _by_pair(report).items():
        rows = [row for row in rows if _finite(row.get("plan")) and _finite(row.get("predicted"))]
        charts.append(svg.scatter([(row["plan"], row["predicted"]) for row in rows],
                                  title=f"{structure} {metric}", x_label="plan (Gy)", y_label="predicted (Gy)",
                                  names=[str(row["patient"]) for row in rows],
                                  highlighted=[k for k, row in enumerate(rows)
                                               if (row["patient"], structure, metric) in flagged]))
    return ("<p>Each point a patient: the plan's value across, the out-of-fold prediction up; on the dashed line "
            "they agree. Red: a flagged plan (section 5).</p>"
            f'<div class="figures">{"".join(charts)}</div>')


def _residuals(report: dict) -> str:
    threshold = (report.get("thresholds") or {}).get("z")
    zs = [row.get("z") for row in report["plans"]]
    markers = [(-threshold, f"-{threshold:g}"), (threshold, f"+{threshold:g}")] if _finite(threshold) else []
    parts = ["<p>The standardised residual z of a patient's metric is its difference (predicted − plan) less the "
             "median difference of that structure and metric, over 1.4826 × their median absolute deviation: a "
             "robust z that outliers do not inflate. The dashed lines are the threshold beyond which a plan is "
             "flagged.</p>",
             '<div class="figures">' + svg.histogram(zs, title="All standardised residuals", x_label="z",
                                                     y_label="rows", markers=markers, width=520, height=240)
             + "</div>", "<h3>Differences per structure and metric</h3>"]
    charts = []
    for (structure, metric), rows in _by_pair(report).items():
        differences = [row.get("difference") for row in rows]
        charts.append(svg.histogram(differences, title=f"{structure} {metric}", x_label="predicted − plan (Gy)",
                                    markers=[(0.0, "0")]))
    parts.append(f'<div class="figures">{"".join(charts)}</div>')
    return "".join(parts)


def _flagged(report: dict) -> str:
    thresholds = report.get("thresholds") or {}
    curves = report.get("dvh_curves") or {}
    dosimetric = report.get("dosimetric_outliers") or []
    geometric = report.get("geometric_outliers") or []
    parts = [f"<h3>Dosimetric outliers ({len(dosimetric)})</h3>",
             "<p>Plans whose achieved metrics lie far from what the model predicts for that anatomy"
             + (f" (|z| above {escape(_fmt(thresholds.get('z'), 2))})" if _finite(thresholds.get("z")) else "")
             + ": a plan that spared an organ much less, or much more, than the cohort's other plans of that "
               "anatomy, or covered a target differently. Each deserves a look at the plan before the model is "
               "trusted (or the plan kept in its training set).</p>"]
    if not dosimetric:
        parts.append('<p class="muted">No plan was flagged.</p>')
    for entry in dosimetric:
        also = entry.get("also") or []
        parts.append(f'<div class="card" id="dosimetric-{escape(entry["patient"])}">'
                     f'<h3>{escape(entry["patient"])} <span class="muted">score {escape(_fmt(entry.get("score"), 1))}'
                     f"</span></h3><p>{escape(entry.get('reason', ''))}.</p>")
        if also:
            parts.append("<p>Also beyond the threshold: " + escape("; ".join(
                f"{a['structure']} {a['metric']} plan {_fmt(a.get('plan'), 1)} Gy, predicted "
                f"{_fmt(a.get('predicted'), 1)} Gy (z = {_fmt(a.get('z'), 1)})" for a in also)) + ".</p>")
        parts.append(_dvh(entry["patient"], curves) + "</div>")
    parts.append(f"<h3>Geometric outliers ({len(geometric)})</h3>"
                 "<p>Patients whose anatomy is unlike the cohort's (structure volumes, the share of each organ "
                 "within 0, 5, 10 and 20 mm of a target, the body's extent, the CT's HU inside the body), each scored "
                 "against the other training patients: a conformal p-value below alpha"
                 + (f" = {escape(_fmt(thresholds.get('alpha'), 2))}" if _finite(thresholds.get("alpha")) else "")
                 + " (a score above the dashed line): the model learned little from anatomy like theirs."
                 + (f" {escape(thresholds['geometric_note'])}." if thresholds.get("geometric_note") else "")
                 + "</p>")
    scores = [entry.get("score") for entry in report.get("geometric_scores") or []]
    if scores:
        threshold = thresholds.get("geometric")
        parts.append('<div class="figures">' + svg.histogram(
            scores, title="Nonconformity score of every training patient", x_label="nonconformity score",
            markers=[(threshold, "threshold")] if _finite(threshold) else [], width=520, height=220) + "</div>")
    if not geometric:
        parts.append('<p class="muted">No patient was flagged.</p>')
    for entry in geometric:
        reasons = entry.get("reasons") or []
        parts.append(f'<div class="card" id="geometric-{escape(entry["patient"])}">'
                     f'<h3>{escape(entry["patient"])} <span class="muted">score '
                     f'{escape(_fmt(entry.get("score"), 2))}'
                     + (f', p = {escape(_fmt(entry.get("p_value"), 3))}' if _finite(entry.get("p_value")) else "")
                     + (f', flagged by {escape(entry["feature"])}' if entry.get("feature") else "")
                     + "</span></h3>"
                     + ("<ul>" + "".join(f"<li>{escape(reason)}</li>" for reason in reasons) + "</ul>"
                        if reasons else '<p class="muted">No single feature stands out: the combination does.</p>')
                     + _dvh(entry["patient"], curves) + "</div>")
    return "".join(parts)


def _dvh(patient: str, curves: dict) -> str:
    """A patient's DVH chart: per structure the plan (solid) and the prediction (dashed), one colour each."""
    structures = curves.get(patient) or {}
    series = []
    for k, (structure, pair) in enumerate(structures.items()):
        colour = svg.PALETTE[k % len(svg.PALETTE)]
        for source, dashed in (("plan", False), ("predicted", True)):
            if pair.get(source):
                series.append({"label": f"{structure} {source}", "points": pair[source], "colour": colour,
                               "dashed": dashed})
    if not series:
        return '<p class="muted">No DVH curves were saved for this patient.</p>'
    return ('<div class="figures">' + svg.lines(series, title=f"{patient}: DVH, plan (solid) and prediction (dashed)",
                                                x_label="dose (Gy)", y_label="volume (%)", y_range=(0.0, 102.0),
                                                height=max(300.0, 50.0 + 15.0 * len(series))) + "</div>")


def _goals(report: dict) -> str:
    goals = report.get("goals") or []
    if not goals:
        return '<p class="muted">The site lists no clinical goals.</p>'
    rows = []
    for goal in goals:
        rows.append([goal.get("goal"), goal.get("n"), _percent(goal.get("plans_meeting")),
                     _percent(goal.get("predictions_meeting")), _percent(goal.get("agreement")),
                     goal.get("plan_only"), goal.get("prediction_only")])
    return ("<p>Per goal of the site: the share of the plans that meet it, of the out-of-fold predictions that "
            "do, and how often the two agree. <b>Plan only</b>: the plan meets the goal where the prediction says "
            "a plan of that anatomy would not (the model is pessimistic there); <b>prediction only</b>: the model "
            "expects the goal met where the plan did not meet it.</p>"
            + _table(["goal", "n", "plans meeting", "predictions meeting", "agreement", "plan only", "prediction only"],
                     rows, text_columns=(0,), table_id="goals-table"))


def _calibration(report: dict) -> str:
    calibration = report.get("calibration") or {}
    if not calibration.get("overall") and not calibration.get("in_distribution"):
        return f'<p class="muted">{escape(calibration.get("note") or "No calibration figures.")}</p>'
    parts = [f"<p>Every prediction of the model (its folds together) carries, per structure and DVH metric, a "
             f"<b>band</b>: a lower and an upper value that hold the value a plan achieves with at least the nominal "
             f"coverage (90 % unless asked otherwise). The bands are made of the out-of-fold residuals of the "
             f"{escape(calibration.get('calibration_patients', '?'))} training patients above "
             f"({escape(calibration.get('method', ''))}). Here they are tried on the "
             f"{len(calibration.get('patients', []))} validation patients, which took no part in them, as the folds' "
             f"ensemble predicted them: how often the band held the plan, against the coverage it claims.</p>"]
    if calibration.get("note"):
        parts.append(f'<p class="muted">{escape(calibration["note"])}</p>')
    overall = calibration.get("overall") or []
    if overall:
        series = [{"label": "nominal", "points": [(0.0, 0.0), (1.0, 1.0)], "colour": "#8c959f", "dashed": True},
                  {"label": "all metrics", "points": [(row["nominal"], row["observed"]) for row in overall],
                   "colour": "#1b1f24"}]
        by_structure: dict[str, list] = {}
        for row in calibration.get("by_structure") or []:
            by_structure.setdefault(row["structure"], []).append((row["nominal"], row["observed"]))
        series += [{"label": structure, "points": points, "colour": svg.PALETTE[k % len(svg.PALETTE)]}
                   for k, (structure, points) in enumerate(by_structure.items())]
        parts.append('<div class="figures">' + svg.lines(
            series, title="Reliability: observed against nominal coverage", x_label="nominal coverage",
            y_label="observed coverage (validation)", y_range=(0.0, 1.02), width=420, height=320,
            legend_width=150) + "</div>")
        parts.append(_table(["nominal", "observed", "rows", "median width (Gy)"],
                            [[_percent(row["nominal"]), _percent(row["observed"]), row["n"],
                              _fmt(row["median_width"], 2)] for row in overall], table_id="coverage-table"))
        shown = [level for level in (0.9, 0.68) if any(abs(row["nominal"] - level) < 1e-9 for row in overall)]
        pairs: dict[tuple, dict] = {}
        for row in calibration.get("by_structure_metric") or []:
            for level in shown:
                if abs(row["nominal"] - level) < 1e-9:
                    pairs.setdefault((row["structure"], row["metric"]), {})[level] = row
        check = calibration.get("range_check")
        if check:
            parts.append(f'<p id="range-check">Each structure-metric at each level is a cell: its observed coverage '
                         f'against the central 95 % range a calibrated band gives n held-out values (Binomial(n, c)/n, '
                         f'c the coverage the band has for exchangeable patients). <b>{escape(check.get("outside"))} '
                         f'of {escape(check.get("cells"))}</b> cells lie outside their range; '
                         f'{escape(_fmt(check.get("expected"), 1))} expected by chance (5 % of the cells; '
                         f'{escape(_fmt(check.get("expected_exact"), 1))} for these cells\' n exactly). Many more '
                         f'outside: the bands do not hold what they claim. The cells of one split share their '
                         f'calibration residuals, so a few more outside is no proof of it.</p>')
            parts.append(_table(["nominal", "cells", "outside their range", "expected (5 %)"],
                                [[_percent(level.get("nominal")), level.get("cells"), level.get("outside"),
                                  _fmt(level.get("expected"), 1)] for level in check.get("by_level") or []],
                                table_id="range-check-table"))
        if pairs:
            header = ["structure", "metric"] + [f"{title} {_percent(level)}" for level in shown
                                                for title in ("observed", "95 % range", "expected", "width")]
            rows, classes = [], []
            for (structure, metric), found in pairs.items():
                row, marks = [structure, metric], {}
                for level in shown:
                    cell = found.get(level) or {}
                    if cell.get("outside"):
                        marks[len(row)] = "outside"
                    row += [_percent(cell.get("observed")) + (" (outside)" if cell.get("outside") else ""),
                            _range(cell.get("range_low"), cell.get("range_high")), _percent(cell.get("exact")),
                            _fmt(cell.get("median_width"), 2)]
                rows.append(row)
                classes.append(marks)
            parts.append("<details><summary>Per structure and metric (observed on the validation patients; its "
                         "binomial 95 % range; expected: the coverage exchangeable patients would have; the median "
                         "band width in Gy)</summary>"
                         + _table(header, rows, text_columns=(0, 1), table_id="coverage-by-metric",
                                  cell_classes=classes) + "</details>")
    scores = calibration.get("in_distribution") or []
    threshold = calibration.get("threshold")
    if scores:
        outside = [entry for entry in scores if not entry.get("inside")]
        parts.append(f"<h3>In-distribution check of the validation patients ({len(outside)} of {len(scores)} "
                     f"outside the training cohort)</h3><p>Each new patient's anatomy is scored against the training "
                     f"cohort's (section 5, geometric outliers); with a p-value below alpha (a score above the dashed "
                     f"line), its prediction says it is outside the training cohort, and why.</p>")
        parts.append('<div class="figures">' + svg.histogram(
            [entry.get("score") for entry in scores], title="Nonconformity score of the validation patients",
            x_label="nonconformity score", markers=[(threshold, "threshold")] if _finite(threshold) else [],
            width=520, height=220) + "</div>")
        parts += [f'<div class="card"><h3>{escape(entry["patient"])} <span class="muted">score '
                  f'{escape(_fmt(entry.get("score"), 2))}, p = {escape(_fmt(entry.get("p_value"), 3))}</span></h3><ul>'
                  + "".join(f"<li>{escape(reason)}</li>" for reason in entry.get("reasons") or []) + "</ul></div>"
                  for entry in outside]
    return "".join(parts)


def _method(report: dict) -> str:
    thresholds = report.get("thresholds") or {}
    return ("<ul><li>Every prediction is out-of-fold: made by a model that did not see the patient.</li>"
            "<li>A plan is a dosimetric outlier when one of its metrics has |z| above "
            f"{escape(_fmt(thresholds.get('z'), 2))}: Iglewicz and Hoaglin's cut for a robust z (for normal "
            "differences, 1 row in about 2,000 by chance).</li>"
            "<li>A patient is a geometric outlier when the conformal p-value of its nonconformity score (how far "
            "its features lie beyond the other training patients' range, in robust scales, plus its missing "
            "structures by their rarity) against the other patients' leave-one-out scores is below alpha = "
            f"{escape(_fmt(thresholds.get('alpha'), 2))}: a patient like the cohort is flagged at most alpha of the "
            "time.</li>"
            "<li>Flags are prompts to look at a plan or a patient, not verdicts.</li></ul>")


# -- pieces ----------------------------------------------------------------------------------------

def _table(header: list[str], rows: Iterable[list], text_columns: tuple[int, ...] = (),
           table_id: str | None = None, cell_classes: list[dict] | None = None) -> str:
    """A table; ``cell_classes``: per row, ``{column: class}`` of the cells to mark."""
    def cell(tag, k, value, marked=""):
        kinds = " ".join(name for name in ("text" if k in text_columns else "", marked) if name)
        kind = f' class="{escape(kinds)}"' if kinds else ""
        return f"<{tag}{kind}>{escape('–' if value is None else value)}</{tag}>"

    rows = list(rows)
    marks = cell_classes or [{}] * len(rows)
    head = "<tr>" + "".join(cell("th", k, name) for k, name in enumerate(header)) + "</tr>"
    body = "".join("<tr>" + "".join(cell("td", k, value, marked.get(k, "")) for k, value in enumerate(row)) + "</tr>"
                   for row, marked in zip(rows, marks))
    identity = f' id="{escape(table_id)}"' if table_id else ""
    return f"<table{identity}><thead>{head}</thead><tbody>{body}</tbody></table>"


def _finite(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _fmt(value, digits: int) -> str:
    """A number with ``digits`` decimals; – for None or NaN."""
    return f"{value:.{digits}f}" if _finite(value) else "–"


def _percent(fraction) -> str:
    return f"{100 * fraction:.0f} %" if _finite(fraction) else "–"


def _range(low, high) -> str:
    """``75–100 %``; – without one."""
    return f"{100 * low:.0f}–{100 * high:.0f} %" if _finite(low) and _finite(high) else "–"

