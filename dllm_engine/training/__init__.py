"""Training our default model's block-diffusion adapter by self-distillation."""
