"""The per-task score files of a ruler run, the files an experiment reads (experiments/ruler.yaml): items.jsonl
holds every task and way in one file; an experiment's score is one field of one file, so each task gets its own.

- ``ruler-TASK.jsonl``: one record a sample and length, ``{sample, length, gen, tf, gen_hit, tf_hit}``: ``gen`` /
  ``tf`` the share of the sample's references found by generation (RULER's string_match_all) / read teacher-forced,
  in percent (a mean's score); ``gen_hit`` / ``tf_hit`` 1 when every reference is (0 else: a proportion's score,
  the only score of a one-reference task, where it equals the share); ``ref_loss`` the teacher-forced loss of the
  reference tokens (nats a token). The grid's samples are ``d{depth in 0.1 %}:{index}`` (``d500:0``: 50 %);
- ``ruler-average.jsonl``: the RULER average's records, one a task sample (``{task}:{index}``) and length over the
  tasks run but the grid, ``gen`` / ``tf`` in percent: a cell's mean over them is the mean over the tasks of each
  task's mean when every task has the same n (the probe's), RULER's average (Hsieh et al. 2024 Sec 4); with the
  sample's ``gen_hit`` / ``tf_hit`` and ``ref_loss`` (over one-reference tasks the hits' share is the average).

Only the ways the run made are written (``--score gen``: no ``tf`` fields).
"""
from __future__ import annotations

from pathlib import Path

from ropescale.common.io import write_jsonl_atomic

from .tasks import GRID

AVERAGE = "average"


def file_name(task: str) -> str:
    """The score file of ``task`` (or of the average, ``AVERAGE``) in a ruler run directory."""
    return f"ruler-{task}.jsonl"


def sample_key(rec: dict) -> str:
    """A record's sample within its task and length: the index, or ``d{depth in 0.1 %}:{index}`` on the grid."""
    d = rec.get("depth")
    return str(rec["index"]) if d is None else f"d{round(d * 1000)}:{rec['index']}"


def score_rows(records: list[dict]) -> dict[str, list[dict]]:
    """{task or AVERAGE: [record, ...]} from a ruler run's items (one record a sample and way), sorted by length and
    sample; a record's way fields only for the ways its items hold."""
    rows: dict[str, dict] = {}
    for r in records:
        row = rows.setdefault(r["task"], {}).setdefault((r["col"], sample_key(r)), {
            "sample": sample_key(r), "length": int(r["col"])})
        w, v = r["way"], float(r["value"])
        row[w] = round(100.0 * v, 6)
        row[f"{w}_hit"] = int(v >= 1.0)
        if w == "tf" and r.get("ref_loss") is not None:
            row["ref_loss"] = round(float(r["ref_loss"]), 6)
    out = {t: [rows[t][k] for k in sorted(rows[t], key=lambda k: (k[0], k[1]))] for t in rows}
    avg = []
    for t in sorted(t for t in out if t != GRID):
        for row in out[t]:
            avg.append({"sample": f"{t}:{row['sample']}", "length": row["length"],
                        **{k: row[k] for k in ("gen", "tf", "gen_hit", "tf_hit", "ref_loss") if k in row}})
    if avg:
        out[AVERAGE] = sorted(avg, key=lambda r: (r["length"], r["sample"]))
    return out


def write_score_files(folder: str | Path, records: list[dict]) -> list[Path]:
    """Write ``ruler-TASK.jsonl`` for each task and ``ruler-average.jsonl`` into ``folder`` (atomic); their paths."""
    paths = []
    for task, rows in score_rows(records).items():
        p = Path(folder) / file_name(task)
        write_jsonl_atomic(p, rows)
        paths.append(p)
    return paths
