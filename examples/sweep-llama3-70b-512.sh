#!/bin/sh
# What-if sweep of Llama 3 70B on 512 H100s (the scenario in examples/llama3-70b-h100.yaml):
# tensor x pipeline split, ZeRO stage and micro-batch size, 36 combinations. Writes the table
# and its plots under docs/; run it again and it resumes (here: finds everything done).
set -e
mkdir -p docs
clustersim sweep examples/llama3-70b-h100.yaml \
  --grid parallel.tp=2,4,8 --grid parallel.pp=2,4,8 \
  --grid parallel.zero=1,3 --grid training.micro_batch=1,2 \
  --out docs/sweep-llama3-70b-512.csv --plots docs/sweep-llama3-70b-512
