"""The model's arithmetic from its shape: parameters, FLOPs and kernels of one layer, what
recomputation re-runs, the tensors each layer saves, MoE routing and latent attention."""
