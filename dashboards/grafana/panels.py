"""Panel builders with tailguard's defaults, on grafana-foundation-sdk's builders.

Every panel reads the dashboard's `datasource` variable. Threshold steps carry a
number even for the base step: the official dashboard schema types
`Threshold.value` as a number, and Grafana sets the first step to -Infinity when it
loads a panel (`validateFieldConfig`), so `0` there draws as Grafana's own `null`.
"""

from __future__ import annotations

from grafana_foundation_sdk.builders import (
    bargauge,
    heatmap,
    prometheus,
    stat,
    statetimeline,
    timeseries,
)
from grafana_foundation_sdk.builders import common as cb
from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm
from grafana_foundation_sdk.models import heatmap as hm
from grafana_foundation_sdk.models.prometheus import PromQueryFormat

from observe.registry import MetricDef

DATASOURCE_VARIABLE = "datasource"
DATASOURCE = cm.DataSourceRef(type_val="prometheus", uid="${" + DATASOURCE_VARIABLE + "}")
_UNITS = {"s": "s", "1": "percentunit"}


def unit_of(metric: MetricDef) -> str:
    """Grafana's unit for a registry metric's values."""
    return _UNITS.get(metric.unit, "short")


def legend_of(label: str) -> str:
    """A legend placeholder for the value of `label`: `{{label}}`."""
    return "{{" + label + "}}"


def query(expr: str, legend: str, ref: str = "A", heatmap_format: bool = False):
    """One PromQL target."""
    target = prometheus.Dataquery().expr(expr).legend_format(legend).ref_id(ref).range()
    return target.format(PromQueryFormat.HEATMAP) if heatmap_format else target


def queries(*pairs: tuple[str, str]) -> list:
    """Targets A, B, C, ... from (expr, legend) pairs."""
    return [query(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(pairs)]


def steps(*pairs: tuple[float, str]):
    """Absolute thresholds from (value, colour) pairs, the base step first."""
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        [dm.Threshold(value=value, color=color) for value, color in pairs])


def _common(panel, title: str, description: str, unit: str, targets: list):
    return panel.title(title).description(description).datasource(DATASOURCE) \
        .unit(unit).targets(targets)


def _legend():
    return cb.VizLegendOptions().show_legend(True).display_mode(
        cm.LegendDisplayMode.LIST).placement(cm.LegendPlacement.BOTTOM)


def _tooltip():
    return cb.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(
        cm.SortOrder.DESCENDING)


def graph(title: str, description: str, unit: str, targets: list, thresholds=None):
    """A time series; `thresholds` are drawn as dashed lines."""
    panel = _common(timeseries.Panel(), title, description, unit, targets) \
        .legend(_legend()).tooltip(_tooltip()).fill_opacity(10).line_width(1)
    if thresholds is not None:
        panel = panel.thresholds(thresholds).thresholds_style(
            cb.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED))
    return panel


def single(title: str, description: str, unit: str, targets: list, thresholds):
    """A stat: the last value, coloured by `thresholds`."""
    reduce = cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)
    return _common(stat.Panel(), title, description, unit, targets) \
        .thresholds(thresholds).reduce_options(reduce) \
        .color_mode(cm.BigValueColorMode.VALUE).graph_mode(cm.BigValueGraphMode.AREA)


def buckets_over_time(title: str, description: str, unit: str, expr: str):
    """A heatmap of a Prometheus histogram's buckets (no re-bucketing by Grafana)."""
    rows = heatmap.RowsHeatmapOptions().layout(cm.HeatmapCellLayout.LE)
    colour = heatmap.HeatmapColorOptions().mode(hm.HeatmapColorMode.SCHEME) \
        .scheme("Oranges").fill("dark-orange").scale(hm.HeatmapColorScale.EXPONENTIAL) \
        .exponent(0.5).steps(64)
    return heatmap.Panel().title(title).description(description).datasource(DATASOURCE) \
        .targets([query(expr, "{{le}}", heatmap_format=True)]).calculate(False) \
        .rows_frame(rows).color(colour).y_axis(heatmap.YAxisConfig().unit(unit)) \
        .show_legend()


def buckets_in_range(title: str, description: str, unit: str, expr: str):
    """Bars: a histogram's observations per bucket over the dashboard's time range
    (the heatmap format turns Prometheus' cumulative buckets into per-bucket counts)."""
    target = query(expr, "{{le}}", heatmap_format=True).instant()
    reduce = cb.ReduceDataOptions().calcs(["lastNotNull"]).values(False)
    return bargauge.Panel().title(title).description(description).datasource(DATASOURCE) \
        .unit(unit).targets([target]).orientation(cm.VizOrientation.VERTICAL) \
        .display_mode(cm.BarGaugeDisplayMode.GRADIENT).reduce_options(reduce)


def states(title: str, description: str, targets: list, thresholds):
    """A state timeline: one lane per series, coloured by `thresholds`."""
    return statetimeline.Panel().title(title).description(description) \
        .datasource(DATASOURCE).targets(targets).thresholds(thresholds) \
        .color_scheme(db.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS)) \
        .legend(_legend())
