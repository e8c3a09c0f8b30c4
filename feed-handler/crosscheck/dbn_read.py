"""Reads a DBN file with Databento's own decoder (PyPI `databento-dbn`) and prints what
`feed-handler export`'s test checks, as one JSON object: the metadata, the number of records
per record type and per (type, action), and per record type and action its first three records and,
per instrument, its last one. Used by tests/dbn_export.rs."""

import json
import sys

import databento_dbn


def plain(v):
    """Enums as their DBN value ('A', 7), flags as their byte."""
    if hasattr(v, "value"):
        return v.value
    if isinstance(v, (bool, int, str)):
        return v
    return int(v) if hasattr(v, "__int__") else str(v)


def fields(r):
    out = {"type": type(r).__name__, "instrument_id": r.instrument_id, "ts_event": r.ts_event}
    for name in ("err", "code", "ts_recv", "order_id", "price", "size", "action", "side", "flags", "depth",
                 "sequence", "reason", "is_trading", "is_quoting", "raw_symbol",
                 "stype_in_symbol", "stype_out_symbol", "min_lot_size_round_lot",
                 "instrument_class", "exchange", "currency"):
        if hasattr(r, name):
            out[name] = plain(getattr(r, name))
    if hasattr(r, "levels"):
        out["levels"] = [[l.bid_px, l.bid_sz, l.bid_ct, l.ask_px, l.ask_sz, l.ask_ct]
                         for l in r.levels]
    return out


def main(path):
    dec = databento_dbn.DBNDecoder()
    with open(path, "rb") as f:
        dec.write(f.read())
    records = dec.decode()
    meta, records = records[0], records[1:]
    counts, actions, first, last = {}, {}, {}, {}
    for r in records:
        t = type(r).__name__
        counts[t] = counts.get(t, 0) + 1
        if hasattr(r, "action"):
            k = f"{t}:{plain(r.action)}"
            actions[k] = actions.get(k, 0) + 1
        key = f"{t}:{plain(r.action)}" if hasattr(r, "action") else t
        first.setdefault(key, [])
        if len(first[key]) < 3:
            first[key].append(fields(r))
        last.setdefault(t, {})[str(r.instrument_id)] = fields(r)
    print(json.dumps({
        "metadata": {
            "version": meta.version,
            "dataset": meta.dataset,
            "schema": str(meta.schema),
            "start": meta.start,
            "end": meta.end,
            "stype_in": str(meta.stype_in),
            "stype_out": str(meta.stype_out),
            "symbols": list(meta.symbols),
            "mappings": {raw: [[str(i["start_date"]), str(i["end_date"]), i["symbol"]]
                                for i in intervals]
                         for raw, intervals in meta.mappings.items()},
        },
        "counts": counts,
        "actions": actions,
        "first": first,
        "last": last,
    }))


if __name__ == "__main__":
    main(sys.argv[1])
