"""Differentiable augmentation of everything D sees, real and fake alike.

DiffAugment-style operations (Zhao et al. 2020): translation, cutout, colour. Each is applied per
sample with probability ``p``; every operation is differentiable in the image, so the generator's
gradient flows through the augmentation of its fakes. With ``adaptive=True``, ``p`` follows the ADA
heuristic (Karras et al. 2020): every ``interval`` generator steps, ``r_t = E[sign(D(real))]`` is
compared with ``target``; ``p`` rises while D is overconfident on real data (overfitting) and falls
otherwise, by ``batch * interval / speed_images`` per adjustment.

``p`` and the sign accumulators are buffers: they are saved, restored and moved with the module.
Written by hand: torchvision's transforms are not differentiable per-sample pipelines with a
tensor-valued probability, and the ADA/DiffAugment reference code cannot be a dependency here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from gan.core.distributed import sum_over_ranks, world_size
from gan.errors import ConfigError

OPERATIONS = ("translation", "cutout", "color")


def translate(x: Tensor, ratio: float = 0.125) -> Tensor:
    """Shift each image by up to ``ratio`` of its size (whole pixels, reflected borders)."""
    n, _, h, w = x.shape
    # Constants enter as Python scalars in arithmetic, never as torch.tensor([...], device=...):
    # building a tensor from a Python list on a GPU is a blocking host-to-device copy, each step.
    u = torch.rand(n, 2, device=x.device) * 2 - 1
    shift_x, shift_y = (u[:, 0] * (w * ratio)).round(), (u[:, 1] * (h * ratio)).round()  # in pixels
    theta = torch.zeros(n, 2, 3, device=x.device, dtype=x.dtype)
    theta[:, 0, 0] = theta[:, 1, 1] = 1
    theta[:, 0, 2] = shift_x * (2 / w)  # pixels -> [-1, 1]
    theta[:, 1, 2] = shift_y * (2 / h)
    grid = F.affine_grid(theta, list(x.shape), align_corners=False)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="reflection", align_corners=False)


def cutout(x: Tensor, ratio: float = 0.5) -> Tensor:
    """Zero one random square of ``ratio`` times the image size per image."""
    n, _, h, w = x.shape
    ch, cw = max(1, int(h * ratio)), max(1, int(w * ratio))
    top = torch.randint(0, h - ch + 1, (n, 1, 1), device=x.device)
    left = torch.randint(0, w - cw + 1, (n, 1, 1), device=x.device)
    rows = torch.arange(h, device=x.device).view(1, h, 1)
    cols = torch.arange(w, device=x.device).view(1, 1, w)
    inside = (rows >= top) & (rows < top + ch) & (cols >= left) & (cols < left + cw)
    return x * (~inside).unsqueeze(1).to(x.dtype)


def color(x: Tensor) -> Tensor:
    """Random brightness, saturation and contrast."""
    n = x.shape[0]
    rand = torch.rand(n, 3, 1, 1, 1, device=x.device, dtype=x.dtype)
    x = x + (rand[:, 0] - 0.5)
    channel_mean = x.mean(dim=1, keepdim=True)
    x = (x - channel_mean) * (rand[:, 1] * 2) + channel_mean
    image_mean = x.mean(dim=(1, 2, 3), keepdim=True)
    return (x - image_mean) * (rand[:, 2] + 0.5) + image_mean


FUNCTIONS = {"translation": translate, "cutout": cutout, "color": color}


class Augment(nn.Module):
    def __init__(self, policy: list[str], p: float = 1.0, adaptive: bool = False, target: float = 0.6,
                 interval: int = 4, speed_images: int = 20_000):
        super().__init__()
        unknown = set(policy) - set(OPERATIONS)
        if unknown:
            raise ConfigError(f"unknown augmentation {sorted(unknown)}: augment.policy may list {OPERATIONS}")
        self.policy, self.adaptive = list(policy), adaptive
        self.target, self.interval, self.speed_images = target, interval, speed_images
        self.register_buffer("p", torch.tensor(float(p)))
        # sum and count of sign(D(real)) since the last adjustment
        self.register_buffer("sign_sum", torch.zeros(()))
        self.register_buffer("sign_count", torch.zeros((), dtype=torch.long))

    def forward(self, x: Tensor) -> Tensor:
        for name in self.policy:
            # Per sample: augmented with probability p, else passed through; both branches keep the
            # graph, so G's gradient reaches the fakes either way.
            chosen = torch.rand(x.shape[0], 1, 1, 1, device=x.device) < self.p
            x = torch.where(chosen, FUNCTIONS[name](x), x)
        return x

    @torch.no_grad()
    def accumulate(self, real_logits: Tensor, keep: Tensor | None = None) -> None:
        """Add the signs of D's outputs on a real batch; under DDP, on every rank's real batch.

        Summed over the ranks as they come in, not at the adjustment: the accumulators, and so r_t and
        ``p``, are then the same on every rank at every step, and a checkpoint (rank 0's) holds the
        whole count, which a resumed run sums on from.
        """
        signs = sum_over_ranks(real_logits.sign().sum().to(self.sign_sum.dtype))
        if keep is None:
            self.sign_sum += signs
            self.sign_count += real_logits.numel() * world_size()
        else:  # ``keep`` False (non-finite logits): counts nothing, decided on the device
            self.sign_sum += torch.where(keep, signs, 0.0)
            self.sign_count += keep.long() * (real_logits.numel() * world_size())

    @torch.no_grad()
    def adjust(self, batch_size: int) -> None:
        """One ADA step from the signs gathered since the last one (call every ``interval`` G steps);
        ``batch_size``: the real images of one generator step, over all ranks."""
        if not self.adaptive:
            return
        r_t = self.sign_sum / self.sign_count.clamp(min=1)
        step = batch_size * self.interval / self.speed_images
        moved = (self.p + torch.sign(r_t - self.target) * step).clamp(0.0, 1.0)
        # Without signs since the last adjustment p stays; torch.where keeps it on the device (no sync).
        self.p.copy_(torch.where(self.sign_count > 0, moved, self.p))
        self.sign_sum.zero_()
        self.sign_count.zero_()


def build_augment(cfg: dict, data_shape: tuple[int, ...]) -> Augment | None:
    """The ``augment`` config group: None for ``augment=none``."""
    if cfg["name"] == "none":
        return None
    if len(data_shape) != 3:
        raise ConfigError(f"augment={cfg['name']} works on images, not 2D points: use augment=none "
                          "(data=ring or data=grid alone trains its 2D recipe, which has none)")
    options = {k: cfg[k] for k in ("target", "interval", "speed_images") if k in cfg}
    return Augment(cfg["policy"], cfg["p"], cfg["adaptive"], **options)
