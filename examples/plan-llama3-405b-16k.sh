#!/bin/sh
# Capacity plan for Llama 3 405B on 16,384 H100s, 15T tokens, with Llama 3's batch (2048
# sequences of 8192 tokens), a GPU MTBF of 50,000 hours (Meta saw 419 interruptions in 54 days
# on 16K GPUs: about one per 3.1 hours), and $2 per GPU-hour. Writes the plots under docs/.
set -e
clustersim plan --model llama3-405b --cluster dgx-h100 --gpus 16384 \
  --tokens 15e12 --global-batch 2048 --seq-len 8192 \
  --mtbf-hours 50000 --gpu-hour-price 2.0 --top 5 \
  --plots docs/plan-llama3-405b-16k
