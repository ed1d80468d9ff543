"""A GAN training framework that demonstrates, measures and enforces PyTorch autograd patterns."""
