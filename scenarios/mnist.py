"""Built-in scenarios ``mlp-mnist`` and ``cnn-mnist``: the seed's two MNIST models on synthetic digits.

From the seed (a CPU-vs-GPU cost-per-epoch comparison of the Keras examples): ``mnist_mlp`` (784-512-512-10
with dropout 0.2) and ``mnist_cnn`` (conv32-conv64-maxpool-dropout-dense128-dropout-dense10), batch 128,
no augmentation. Keras feeds both from an in-memory array, so the per-item loading cost is tiny; the data
here is deliberately cheap as well (~0.15 ms per item, collation included), and the models are small: the
cases where a GPU has the least to accelerate.

The data is SYNTHETIC, never downloaded: 28x28 grayscale uint8 digits 0-9, drawn procedurally as strokes
(arcs and polylines per digit class) under a random slant, rotation, scale and stroke width, anti-aliased,
inside the central 20x20 box as MNIST's are, so a model can actually learn them.

Invariants:
- Construction is cheap (< 1 s): only a small bank of templates is drawn (~0.2 s; once per process and
  seed, then shared read-only by both scenarios); item ``i`` is derived from it on access (a template pick,
  a shift of up to 2 px, an intensity factor and faint noise).
- Item ``i`` is a pure function of ``(seed, i)``, whatever the worker count or access order: every random
  draw comes from a generator seeded by those values, never from the global or per-worker RNG. There is
  no augmentation (as in the Keras examples), hence no ``set_epoch``.
- Items are ``(float32 tensor [1, 28, 28] in [0, 1], int64 label in 0..9)``: Keras scales by 1/255 and
  does not normalise further. The MLP flattens its input itself, so both scenarios share one dataset.
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from pipelines import stages
from scenarios.base import Scenario
from scenarios.common import SeededItems, cross_entropy, draw_bank, keras_init, shared_read_only

SIZE = 28
NUM_CLASSES = 10
VARIANTS_PER_CLASS = 32
# Per-item shift of the template, px; MNIST centres digits by their centre of mass, so shifts are small.
SHIFT = 2
# MNIST digits are fitted into a 20x20 box centred in the 28x28 frame.
BOX = 20.0

Stroke = list[tuple[float, float]]


def _arc(centre: tuple[float, float], radii: tuple[float, float], t0: float, t1: float) -> Stroke:
    """Points of an elliptic arc in the unit box (y down), from angle ``t0`` to ``t1`` degrees (y up)."""
    (cx, cy), (rx, ry) = centre, radii
    # A point every 8 degrees: the chords stay under 1.5 px on the largest loop (the 0).
    t = np.radians(np.linspace(t0, t1, max(3, int(abs(t1 - t0) / 8) + 1)))
    return list(zip((cx + rx * np.cos(t)).tolist(), (cy - ry * np.sin(t)).tolist(), strict=True))


# The strokes of each digit in a unit box, x right and y down, before the per-template jitter.
_STROKES: dict[int, list[Stroke]] = {
    0: [_arc((0.5, 0.5), (0.36, 0.48), 0, 360)],
    1: [[(0.35, 0.2), (0.56, 0.02), (0.5, 0.98)]],
    2: [[*_arc((0.5, 0.3), (0.35, 0.3), 160, -40), (0.1, 0.98), (0.92, 0.98)]],
    3: [_arc((0.5, 0.27), (0.3, 0.25), 150, -90), _arc((0.5, 0.74), (0.34, 0.25), 90, -150)],
    4: [[(0.66, 0.98), (0.66, 0.02), (0.08, 0.68), (0.94, 0.68)]],
    5: [[(0.86, 0.02), (0.22, 0.02), (0.18, 0.46)], _arc((0.47, 0.68), (0.34, 0.29), 140, -150)],
    6: [[(0.76, 0.03), (0.45, 0.2), (0.25, 0.48), (0.22, 0.72)], _arc((0.5, 0.72), (0.28, 0.26), 0, 360)],
    7: [[(0.08, 0.03), (0.92, 0.03), (0.4, 0.98)]],
    8: [_arc((0.5, 0.26), (0.24, 0.23), 0, 360), _arc((0.5, 0.73), (0.3, 0.26), 0, 360)],
    9: [_arc((0.5, 0.28), (0.29, 0.26), 0, 360), [(0.79, 0.3), (0.73, 0.62), (0.6, 0.98)]],
}
_YY, _XX = (g.reshape(-1, 1) for g in np.mgrid[0:SIZE, 0:SIZE].astype(np.float32))


def _distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance from each pixel centre to the nearest of the segments ``a[k] -> b[k]`` ([n, 2] each)."""
    ab = b - a
    # Projection of each pixel onto each segment, clamped to the segment: [pixels, segments].
    px, py = _XX - a[:, 0], _YY - a[:, 1]
    t = np.clip((px * ab[:, 0] + py * ab[:, 1]) / np.maximum((ab**2).sum(1), 1e-6), 0.0, 1.0)
    dist: np.ndarray = np.sqrt(((px - t * ab[:, 0]) ** 2 + (py - t * ab[:, 1]) ** 2).min(1))
    return dist


def _draw(label: int, rng: np.random.Generator) -> np.ndarray:
    """One float32 [28, 28] digit of class ``label`` in [0, 1], its writing style drawn from ``rng``."""
    slant, angle = rng.uniform(-0.3, 0.3), np.radians(rng.uniform(-10.0, 10.0))
    sx, sy = rng.uniform(0.65, 1.0), rng.uniform(0.85, 1.0)
    width = rng.uniform(0.9, 1.9)  # half-width of the pen, px
    rotation = np.array([[np.cos(angle), np.sin(angle)], [-np.sin(angle), np.cos(angle)]])
    starts, ends = [], []
    for stroke in _STROKES[label]:
        p = np.asarray(stroke) - 0.5
        # Hand tremor, per stroke and per point, so that no two templates share a shape exactly.
        p = p + rng.normal(0.0, 0.03, 2) + rng.normal(0.0, 0.012, p.shape)
        p[:, 0] = (p[:, 0] - slant * p[:, 1]) * sx  # slant leans the top to the right, as handwriting does
        p[:, 1] *= sy
        p = ((p @ rotation) * BOX + SIZE / 2 - 0.5).astype(np.float32)
        starts.append(p[:-1])
        ends.append(p[1:])
    dist = _distance(np.concatenate(starts), np.concatenate(ends))
    # A 1-px linear ramp at the pen's edge anti-aliases the stroke.
    img: np.ndarray = np.clip(width + 0.5 - dist, 0.0, 1.0).reshape(SIZE, SIZE).astype(np.float32)
    return img


def make_template_bank(seed: int, variants: int = VARIANTS_PER_CLASS) -> np.ndarray:
    """uint8 [10, variants, 28, 28]: the only digits ever drawn from scratch."""
    bank = draw_bank(seed, 0xD161, _draw, classes=NUM_CLASSES, variants=variants)
    return np.round(bank * 255).astype(np.uint8)


@shared_read_only
def _padded_bank(seed: int) -> np.ndarray:
    """The bank zero-padded by ``SHIFT`` px, read-only: shared by every dataset of the same seed (both
    scenarios, repeated constructions), since drawing it is most of the construction cost."""
    return np.pad(make_template_bank(seed), ((0, 0), (0, 0), (SHIFT, SHIFT), (SHIFT, SHIFT)))


class SyntheticDigits(SeededItems):
    """Synthetic MNIST-shaped map-style dataset; see the module docstring for its invariants."""

    def __init__(self, length: int = 60000, *, seed: int = 0) -> None:
        super().__init__(length, seed=seed, num_classes=NUM_CLASSES)
        self._bank = _padded_bank(seed)

    def raw(self, index: int) -> tuple[np.ndarray, int]:
        """The uint8 [28, 28] image and label of item ``index``."""
        label = self.label(index)
        rng = self.item_rng(index)
        variant, dy, dx = rng.integers((VARIANTS_PER_CLASS, 2 * SHIFT + 1, 2 * SHIFT + 1))
        # A window into the zero-padded template is the shift, without np.roll's copy and wrap-around.
        base = self._bank[label, variant, dy : dy + SIZE, dx : dx + SIZE]
        img = base * np.float32(rng.uniform(0.8, 1.1)) + rng.standard_normal(base.shape, np.float32) * 6.0
        return np.clip(img, 0, 255).astype(np.uint8), label

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        # the loader's stages (pipelines.stages, timed in a stallscope run only): drawing the item stands in for
        # reading it (fetch), the float conversion is the decode; nothing is augmented
        with stages.timed("fetch"):
            img, label = self.raw(index)
        with stages.timed("decode"):
            x = torch.from_numpy(img.astype(np.float32) / np.float32(255.0)).unsqueeze(0)
            return x, torch.tensor(label, dtype=torch.int64)


class MnistMLP(nn.Module):
    """Keras ``mnist_mlp``: 784 -> 512 -> 512 -> 10, ReLU, dropout 0.2 after each hidden layer."""

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Flatten(),
            nn.Linear(SIZE * SIZE, 512), nn.ReLU(inplace=True), nn.Dropout(0.2),
            nn.Linear(512, 512), nn.ReLU(inplace=True), nn.Dropout(0.2),
            nn.Linear(512, num_classes),
        )  # fmt: skip
        keras_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.net(x)
        return logits


class MnistCNN(nn.Module):
    """Keras ``mnist_cnn``: two valid 3x3 convs (32, 64), max-pool 2, dropout 0.25, dense 128, dropout 0.5."""

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 32, 3), nn.ReLU(inplace=True),  # 28 -> 26
            nn.Conv2d(32, 64, 3), nn.ReLU(inplace=True),  # 26 -> 24
            nn.MaxPool2d(2), nn.Dropout(0.25),  # 24 -> 12
        )  # fmt: skip
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * 12 * 12, 128), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(128, num_classes),
        )  # fmt: skip
        keras_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.features(x))
        return logits


# Sized for a 10-30 s default run on the project's 2-core CPU host. Measured there with `stallscope run NAME`
# (torch 2.14.1, 2 threads, batch 128, workers=0, plain SGD momentum 0.9, host otherwise idle):
# mlp-mnist 20 + 450 steps: 26.5 ms/step (18.7 ms of it loading, 7.7 ms compute), 4,830 samples/s, 11.9 s
#   measured, 17.2 s for the whole command; an earlier idle run of 600 steps averaged 37.4 ms/step.
MLP_STEPS = 450
MLP_WARMUP = 20
# cnn-mnist 3 + 100 steps: 215 ms/step (31 ms loading, 184 ms compute), 595 samples/s, 21.5 s measured,
#   28.4 s for the whole command.
# The loading is the same ~0.15 ms per item for both (derivation plus collation); only the model differs, so
# the MLP is loader-bound (stall ~70 %) and the CNN compute-bound even on this CPU.
CNN_STEPS = 100
CNN_WARMUP = 3

# lr 0.05 is for the runner's SGD (the Keras examples use RMSprop and Adadelta): measured, both models pass
# 95 % held-out accuracy within their default run.
_DATA_NOTE = "synthetic stroke-drawn digits (32 templates/class, shift ±2 px, intensity, noise); no augmentation"

MLP_MNIST = Scenario(
    name="mlp-mnist",
    dataset=SyntheticDigits,
    model=MnistMLP,
    loss=cross_entropy,
    batch_size=128,
    description="784-512-512-10 MLP (Keras mnist_mlp) on synthetic MNIST-shaped 28x28 digits, no augmentation",
    steps=MLP_STEPS,
    warmup=MLP_WARMUP,
    lr=0.05,
    extra={"data": _DATA_NOTE, "keras_example": "mnist_mlp"},
)

CNN_MNIST = Scenario(
    name="cnn-mnist",
    dataset=SyntheticDigits,
    model=MnistCNN,
    loss=cross_entropy,
    batch_size=128,
    description="conv32-conv64-dense128 CNN (Keras mnist_cnn) on synthetic MNIST-shaped 28x28 digits",
    steps=CNN_STEPS,
    warmup=CNN_WARMUP,
    lr=0.05,
    extra={"data": _DATA_NOTE, "keras_example": "mnist_cnn"},
)
