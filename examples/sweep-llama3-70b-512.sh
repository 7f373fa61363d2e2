#!/bin/sh
# What-if sweep of Llama 3 70B on 512 H100s (the scenario in examples/llama3-70b-h100.yaml):
# tensor x pipeline split, ZeRO stage and micro-batch size, 36 combinations. Regenerates the
# shipped table docs/sweep-llama3-70b-512.csv (with its .fingerprint.json) and its plots;
# --fresh recomputes every point rather than resuming the table already there.
# tests/reports/test_shipped_sweep.py fails when the shipped table is stale: run this again.
set -e
mkdir -p docs
clustersim sweep examples/llama3-70b-h100.yaml \
  --grid parallel.tp=2,4,8 --grid parallel.pp=2,4,8 \
  --grid parallel.zero=1,3 --grid training.micro_batch=1,2 \
  --out docs/sweep-llama3-70b-512.csv --plots docs/sweep-llama3-70b-512 --fresh
