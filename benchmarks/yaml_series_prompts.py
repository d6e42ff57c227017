"""Build the ``yaml-series`` prompt set (specdec/prompts/data/yaml_series.jsonl): 16 similar structured-conversion calls.

Each prompt asks for the same YAML keys about a different item, so the outputs share their structure across calls
(what suffix decoding's cross-call cache learns) and every output repeats the key list its prompt holds (what prompt
lookup copies). Run in file order, as an agent would issue them (issue 59 item 1).

    python benchmarks/yaml_series_prompts.py [--out PATH]

Rows: ``id`` (``yaml-NN``), ``category`` (``yaml``), ``item``, ``prompt``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ITEMS = ["apple", "banana", "mango", "pineapple", "carrot", "potato", "tomato", "cucumber", "hammer", "screwdriver",
         "wrench", "saw", "violin", "guitar", "piano", "trumpet"]
TEMPLATE = ("Describe the {item} as YAML with exactly these keys: name, category, origin, typical_weight_kg, colors "
            "(a list), uses (a list of three), fun_fact. Reply with the YAML only.")
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "specdec" / "prompts" / "data" / "yaml_series.jsonl"


def rows() -> list[dict[str, str]]:
    return [{"id": f"yaml-{i:02d}", "category": "yaml", "item": item, "prompt": TEMPLATE.format(item=item)}
            for i, item in enumerate(ITEMS, start=1)]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    args.out.write_text("".join(json.dumps(row) + "\n" for row in rows()))
    print(f"wrote {len(ITEMS)} prompts to {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
