#!/bin/sh
# The pipeline timelines of every shipped schedule for the same split (README, "Zero-bubble pipeline
# schedules"): the weight-gradient halves (brown) fill what 1F1B leaves idle.
set -e
clustersim simulate examples/zero-bubble-h1.yaml --set parallel.schedule=1f1b \
  --timeline docs/timeline-1f1b.png
clustersim simulate examples/zero-bubble-h1.yaml --set parallel.schedule=gpipe \
  --timeline docs/timeline-gpipe.png
clustersim simulate examples/zero-bubble-h1.yaml --set parallel.schedule=interleaved \
  --set parallel.virtual_stages=2 --timeline docs/timeline-interleaved.png
clustersim simulate examples/zero-bubble-h1.yaml --timeline docs/timeline-zb-h1.png
# ZB-H2: up to 2 pp - 1 micro-batches in flight, weight halves filling both ends.
clustersim simulate examples/zero-bubble-h1.yaml --set parallel.schedule=zb-h2 \
  --timeline docs/timeline-zb-h2.png
# ZB-V: two chunks per rank in a V, rank 0 holding the embedding and the output layer.
clustersim simulate examples/zero-bubble-h1.yaml --set parallel.schedule=zb-v \
  --set parallel.virtual_stages=2 --timeline docs/timeline-zb-v.png
# DualPipeV: the same V, forwards of one chunk paired with whole backwards of the other.
clustersim simulate examples/zero-bubble-h1.yaml --set parallel.schedule=dualpipev \
  --set parallel.virtual_stages=2 --timeline docs/timeline-dualpipev.png
# DualPipe: two copies of the model, half the micro-batches down the ranks, half up.
clustersim simulate examples/zero-bubble-h1.yaml --set parallel.schedule=dualpipe \
  --set parallel.virtual_stages=2 --timeline docs/timeline-dualpipe.png
