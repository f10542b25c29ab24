"""The paper's accuracy tables (1, 2, 3, 6, 8) as long frames of cells."""

from __future__ import annotations

import pandas as pd

from scale_fpt import published
from scale_fpt.report.tables.cells import (
    DEFAULT_METRIC,
    FINETUNE_ORDER,
    INIT_ORDER,
    annotate,
    cells,
    fixed_lr,
    prepare,
    rank,
    size_order,
)


def frozen_transformers(df: pd.DataFrame) -> pd.Series:
    return (df["kind"] == "transformer") & (df["finetune_label"] == "fpt")


def pretrained_transformers(df: pd.DataFrame) -> pd.Series:
    return (df["kind"] == "transformer") & (df["init_label"] == "pretrained")


def selected(trials: pd.DataFrame, metric: str, mask) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(trials of a table, trials of it left out as other rates of an LR search)."""
    kept, dropped = fixed_lr(prepare(trials, metric))
    return kept[mask(kept)], dropped[mask(dropped)]


def ranks(values: pd.Series, order) -> pd.Series:
    """Position of each value in ``order`` (unknown values last), as floats."""
    return pd.Series([rank(v, tuple(order)) for v in values], index=values.index, dtype=float)


def init_rank(df: pd.DataFrame) -> pd.Series:
    return ranks(df["init_label"], INIT_ORDER)


def table1_full(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Table 1: FPT vs fully trained transformer vs fully trained LSTM."""
    return settings_table(
        trials,
        "T1",
        metric,
        "Table 1: FPT vs fully trained transformer and LSTM",
        "FPT (language-pretrained, finetune fpt), transformers trained fully from random "
        "init (finetune full), LSTMs trained fully",
    )


def table2_init(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Table 2: frozen transformers (finetune fpt) by initialisation, per task."""
    df, dropped = selected(trials, metric, frozen_transformers)
    paper = {s[0]: row for row, s in published.ROW_SETTINGS["T2"].items()}
    out = cells(
        df,
        "T2",
        df["model_label"] + " · " + df["init_label"],
        df["init_label"].map(paper),
        size_order(df) * 10 + init_rank(df),
    )
    return annotate(
        out,
        "Table 2: frozen transformer by initialisation",
        "transformers with finetune fpt (input, output, layer norms, positions), every init",
        df,
        dropped,
    )


def table3_lstm(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Table 3: random frozen transformer vs random frozen LSTM."""
    return settings_table(
        trials,
        "T3",
        metric,
        "Table 3: random frozen transformer vs random frozen LSTM",
        "random-init transformers with finetune fpt; LSTMs with the LSTM frozen",
    )


def settings_table(trials, table: str, metric: str, title: str, selection: str):
    """A table whose rows are the paper's rows (``published.ROW_SETTINGS[table]``)."""
    settings = published.ROW_SETTINGS[table]
    lookup = {s: row for row, s in settings.items()}

    def paper_rows(d: pd.DataFrame) -> pd.Series:
        keys = zip(d["init_label"], d["finetune_label"], d["kind"], strict=True)
        return pd.Series([lookup.get(k) for k in keys], index=d.index, dtype=object)

    df, dropped = selected(trials, metric, lambda d: paper_rows(d).notna())
    rows = paper_rows(df)
    out = cells(
        df,
        table,
        rows + " · " + df["model_label"],
        rows,
        ranks(rows, list(settings)) * 1e13 + size_order(df),
    )
    return annotate(out, title, selection, df, dropped)


def table6_size(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Table 6: frozen (fpt) transformers by model size, with total and trained parameter
    counts; one cell per (task, model, init)."""
    df, dropped = selected(trials, metric, frozen_transformers)
    sizes = published.SIZES.set_index("model")["size"]
    names = {"pretrained": "FPT", "random": "random"}
    paper_rows = pd.Series(
        [
            f"{sizes[m]} {names[i]}" if m in sizes.index and i in names else None
            for m, i in zip(df["model"], df["init_label"], strict=True)
        ],
        index=df.index,
        dtype=object,
    )
    out = cells(
        df,
        "T6",
        df["model_label"],
        paper_rows,
        size_order(df) * 10 + init_rank(df),
        by=("row", "task", "init_label"),
    )
    return annotate(
        out,
        "Table 6: accuracy by model size (frozen, finetune fpt)",
        "transformers with finetune fpt, every model and init",
        df,
        dropped,
    )


def table8_finetune(trials: pd.DataFrame, metric: str = DEFAULT_METRIC) -> pd.DataFrame:
    """Table 8: fine-tuning more (or less) of a language-pretrained transformer; † marks
    cells where a seed diverged (its value is the accuracy before divergence)."""
    df, dropped = selected(trials, metric, pretrained_transformers)
    paper = {s[1]: row for row, s in published.ROW_SETTINGS["T8"].items()}
    out = cells(
        df,
        "T8",
        df["model_label"] + " · " + df["finetune_label"],
        df["finetune_label"].map(paper),
        size_order(df) * 100 + ranks(df["finetune_label"], FINETUNE_ORDER),
    )
    return annotate(
        out,
        "Table 8: fine-tuning subsets (language-pretrained transformer)",
        "language-pretrained transformers, every finetune subset",
        df,
        dropped,
    )
