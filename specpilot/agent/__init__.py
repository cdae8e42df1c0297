"""SpecPilot's search loop: for one deployment, find the engine configuration with the largest lossless
speedup over autoregressive decoding, and remember what worked (docs/search.md).

    space.py       every engine knob with its type, range and constraints; applies and validates deltas
    backend.py     a deployment made runnable: models, prompt batches, engines (real or scripted fake)
    trials.py      one trial = token forcing against stock, then measurement; the fsync'd JSONL trial log
    runner.py      runs trials in-process, or one worker process per GPU
    ceilings.py    hardware ceilings per stage from the cost model (zeros, logged, until it is available)
    proposers/     offline (memory remedies for the largest gap, then local moves) and gemini
    memory.py      schema-versioned mechanism records in memory_store/
    loop.py        baseline → rounds (gap report → proposals → trials → integration) → summary
    transfer.py    memory transfer: a search seeded with records vs one without, who finds its best first
"""
