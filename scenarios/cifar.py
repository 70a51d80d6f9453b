"""Built-in scenario ``cifar-vgg``: the Keras ``cifar10_cnn`` VGG-like CNN on synthetic CIFAR-10-shaped data.

From the seed (a CPU-vs-GPU cost-per-epoch comparison of the Keras examples): ``cifar10_cnn``, batch 32,
trained through ``ImageDataGenerator(width_shift_range=0.1, height_shift_range=0.1, horizontal_flip=True)``
whose default fill mode is "nearest". That augmentation is paid per item in ``__getitem__`` here, so the
cost lands where a real loader pays it: on the main process or a worker.

The data is SYNTHETIC, never downloaded: 32x32 RGB uint8 images in 10 classes named after CIFAR-10's,
drawn procedurally as class-dependent scenes (a sky/ground or sea/road background and an object built from
ellipses, boxes and triangles: wings, wheels, ears, legs, hulls) with jittered position, size and colours,
so a model can actually learn them.

Invariants:
- Construction is cheap (< 1 s): only a small bank of templates is drawn (~0.1 s; once per process and
  seed, then shared read-only); item ``i`` is derived from it on access (a template pick, per-channel gain,
  noise).
- Item ``i`` is a pure function of ``(seed, i)`` before augmentation and of ``(seed, i, epoch)`` after it,
  whatever the worker count or access order: every random draw comes from a generator seeded by those
  values, never from the global or per-worker RNG. Call ``set_epoch`` to get fresh augmentation per epoch
  (non-persistent workers receive a fresh copy of the dataset each epoch, so it propagates).
- Items are ``(float32 tensor [3, 32, 32] in [0, 1], int64 label in 0..9)``: Keras scales by 1/255 and
  does not normalise further.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from pipelines import stages
from scenarios.base import Scenario
from scenarios.common import AugmentedItems, cross_entropy, draw_bank, keras_init, shared_read_only

SIZE = 32
NUM_CLASSES = 10
CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
VARIANTS_PER_CLASS = 32
# Keras's width/height_shift_range=0.1 of 32 px, rounded to whole pixels so that the nearest-fill shift is
# an edge-padded crop rather than an interpolation.
SHIFT = 3

_Y, _X = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32) + 0.5

Colour = tuple[float, float, float]
Mask = np.ndarray
_Parts = list[tuple[Mask, float]]  # an object's parts as (mask, shade), in drawing order


class _Frame:
    """Pixel-centre coordinates in an object's own frame; its methods return boolean masks of shapes there."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = x, y

    def ellipse(self, cx: float, cy: float, rx: float, ry: float) -> Mask:
        inside: Mask = ((self.x - cx) / rx) ** 2 + ((self.y - cy) / ry) ** 2 <= 1.0
        return inside

    def box(self, x0: float, x1: float, y0: float, y1: float) -> Mask:
        inside: Mask = (self.x >= x0) & (self.x < x1) & (self.y >= y0) & (self.y < y1)
        return inside

    def triangle(self, *corners: tuple[float, float]) -> Mask:
        (ax, ay), (bx, by), (cx, cy) = corners

        def side(px: float, py: float, qx: float, qy: float) -> np.ndarray:
            return (qx - px) * (self.y - py) - (qy - py) * (self.x - px)

        s1, s2, s3 = side(ax, ay, bx, by), side(bx, by, cx, cy), side(cx, cy, ax, ay)
        inside: Mask = ((s1 >= 0) & (s2 >= 0) & (s3 >= 0)) | ((s1 <= 0) & (s2 <= 0) & (s3 <= 0))
        return inside

    def line(self, p: tuple[float, float], q: tuple[float, float], width: float) -> Mask:
        (px, py), (qx, qy) = p, q
        dx, dy = qx - px, qy - py
        t = np.clip(((self.x - px) * dx + (self.y - py) * dy) / max(dx * dx + dy * dy, 1e-6), 0.0, 1.0)
        inside: Mask = np.hypot(self.x - px - t * dx, self.y - py - t * dy) <= width
        return inside


# Per class: sky (top) colour, ground (bottom) colour, the horizon's row range, and the object's base colours.
# Shared palettes (sky above road, sky above grass) make the background a hint, not the answer.
_SKY, _GRASS, _ROAD, _SEA, _WALL = (130, 175, 225), (80, 130, 60), (95, 95, 100), (40, 80, 140), (200, 180, 150)
_SCENES: dict[int, tuple[Colour, Colour, tuple[float, float], tuple[Colour, ...]]] = {
    0: (_SKY, _SKY, (32, 32), ((210, 210, 215), (170, 175, 185), (230, 230, 235))),
    1: (_SKY, _ROAD, (17, 22), ((180, 30, 30), (30, 60, 160), (230, 230, 230), (30, 30, 30))),
    2: (_SKY, _GRASS, (22, 30), ((120, 80, 40), (40, 40, 40), (220, 190, 40))),
    3: (_WALL, _WALL, (20, 26), ((220, 130, 50), (120, 120, 120), (40, 40, 40))),
    4: (_GRASS, (110, 95, 60), (10, 16), ((150, 100, 60), (120, 80, 45))),
    5: (_GRASS, _WALL, (18, 26), ((140, 90, 50), (30, 30, 30), (225, 220, 210))),
    6: ((90, 110, 60), (110, 95, 60), (8, 14), ((70, 140, 50), (110, 120, 50), (140, 110, 60))),
    7: (_SKY, _GRASS, (12, 17), ((90, 55, 30), (30, 25, 20), (220, 215, 205))),
    8: (_SKY, _SEA, (14, 19), ((235, 235, 235), (130, 130, 140), (170, 40, 40))),
    9: (_SKY, _ROAD, (17, 22), ((230, 230, 230), (200, 160, 30), (50, 90, 160))),
}


def _airplane(f: _Frame, rng: np.random.Generator) -> _Parts:
    """Airplane: swept wings, fuselage, tail fin."""
    j = rng.uniform
    span = j(9.0, 12.0)
    return [
        (f.triangle((-2, 0), (3, 0), (-4, -span)) | f.triangle((-2, 0), (3, 0), (-4, span)), 0.8),
        (f.ellipse(0, 0, j(10.0, 13.0), j(2.0, 3.0)), 1.0),
        (f.triangle((-12, 0), (-8, 0), (-12, -j(5.0, 7.0))), 0.9),
    ]


def _road_vehicle(label: int, f: _Frame, rng: np.random.Generator) -> _Parts:
    """Automobile and truck: body, cabin or cargo box, dark wheels."""
    j = rng.uniform
    parts: _Parts
    if label == 1:
        parts = [(f.box(-11, 11, -3, 4), 1.0), (f.box(-6, j(4.0, 6.0), -8, -3), 0.85)]
    else:
        parts = [(f.box(-13, j(5.0, 7.0), -12, 4), 1.0), (f.box(7, 13, -5, 4), 0.75)]
    parts.append((f.ellipse(-7, 4.5, 2.8, 2.8) | f.ellipse(8, 4.5, 2.8, 2.8), 0.15))
    return parts


def _bird(f: _Frame, rng: np.random.Generator) -> _Parts:
    """Bird: body, head, beak, darker wing."""
    j = rng.uniform
    return [
        (f.ellipse(0, 0, j(5.0, 7.0), j(3.5, 4.5)), 1.0),
        (f.ellipse(5.5, -3.5, 2.8, 2.8), 1.0),
        (f.triangle((8, -4.5), (8, -2.5), (11, -3.5)), 1.6),
        (f.ellipse(-1.5, -0.5, 4.0, 2.0), 0.7),
    ]


def _cat(f: _Frame, rng: np.random.Generator) -> _Parts:
    """Cat: body, head, pointed ears, eyes."""
    j = rng.uniform
    return [
        (f.ellipse(0, 5, j(7.0, 9.0), 5.5), 0.9),
        (f.ellipse(0, -3, 6.5, 5.5), 1.0),
        (f.triangle((-6, -5), (-1.5, -7), (-5.5, -12)) | f.triangle((6, -5), (1.5, -7), (5.5, -12)), 1.0),
        (f.ellipse(-2.5, -3.5, 1.0, 1.0) | f.ellipse(2.5, -3.5, 1.0, 1.0), 0.3),
    ]


def _deer_or_horse(label: int, f: _Frame, rng: np.random.Generator) -> _Parts:
    """Deer and horse: body, legs, neck, head; the horse is bigger, the deer has antlers."""
    j = rng.uniform
    big = float(label == 7)
    legs = [((-6, 2), (-6.5, 11)), ((-3, 2), (-3, 11)), ((5, 2), (5.5, 11)), ((8, 2), (8, 11))]
    parts = [
        (f.ellipse(0, 0, j(8.0, 10.0) + 2 * big, 4.0 + big), 1.0),
        (np.logical_or.reduce([f.line(p, q, 1.0) for p, q in legs]), 0.8),
        (f.line((7, -1), (10 + 2 * big, -8 - 2 * big), 1.8 + 0.6 * big), 1.0),
        (f.ellipse(11.5 + 2 * big, -9 - 2 * big, 2.8 + big, 1.8), 1.0),
    ]
    if not big:
        parts.append((f.line((11, -10), (9, -14), 0.6) | f.line((12, -10), (14, -14), 0.6), 0.6))
    return parts


def _dog(f: _Frame, rng: np.random.Generator) -> _Parts:
    """Dog: body, head, floppy ears, pale muzzle."""
    j = rng.uniform
    return [
        (f.ellipse(-2, 5, j(8.0, 10.0), 5.0), 0.9),
        (f.ellipse(3, -3, 6.0, 5.5), 1.0),
        (f.ellipse(-3, -1, 2.0, 4.5) | f.ellipse(9, -1, 2.0, 4.5), 0.6),
        (f.ellipse(3, 0, 3.0, 2.0), 1.5),
    ]


def _frog(f: _Frame, rng: np.random.Generator) -> _Parts:
    """Frog: wide flat body, eye bumps, darker spots."""
    j = rng.uniform
    return [
        (f.ellipse(0, 2, j(10.0, 12.0), j(5.0, 6.5)), 1.0),
        (f.ellipse(-4.5, -3.5, 2.2, 2.2) | f.ellipse(4.5, -3.5, 2.2, 2.2), 1.1),
        (f.ellipse(-3, 3, 1.5, 1.2) | f.ellipse(4, 4, 1.5, 1.2) | f.ellipse(0, 0, 1.2, 1.0), 0.6),
    ]


def _ship(f: _Frame, rng: np.random.Generator) -> _Parts:
    """Ship: hull (a trapezoid), superstructure, mast."""
    j = rng.uniform
    return [
        (f.box(-12, 12, 1, 5) & (np.abs(f.x) < 14 - (f.y - 1)), 1.0),
        (f.box(-5, j(4.0, 7.0), -4, 1), 0.85),
        (f.line((0, -4), (0, -12), 0.6), 0.6),
    ]


# the classes drawn by a label-free function (the rest share one between two classes); any other label is a ship
_SHAPES: dict[int, Callable[[_Frame, np.random.Generator], _Parts]] = {
    0: _airplane,
    2: _bird,
    3: _cat,
    5: _dog,
    6: _frog,
}


def _object(label: int, f: _Frame, rng: np.random.Generator) -> _Parts:
    """The object's parts as (mask, shade) in drawing order; ``f`` is the object's frame (centre 0, 0)."""
    if label in (1, 9):
        return _road_vehicle(label, f, rng)
    if label in (4, 7):
        return _deer_or_horse(label, f, rng)
    return _SHAPES.get(label, _ship)(f, rng)


def _draw(label: int, rng: np.random.Generator) -> np.ndarray:
    """One float32 [32, 32, 3] scene of class ``label`` in 0..255, its layout and colours jittered by ``rng``."""
    sky, ground, (h_lo, h_hi), palette = _SCENES[label]
    horizon = rng.uniform(h_lo, h_hi)
    jitter = rng.uniform(-25, 25, (2, 3))
    # A soft horizon (2 px ramp) and a vertical brightness gradient, so that no pixel is a class constant.
    t = np.clip((_Y - horizon) / 2.0 + 0.5, 0.0, 1.0)[..., None]
    img = (np.asarray(sky) + jitter[0]) * (1 - t) + (np.asarray(ground) + jitter[1]) * t
    img = img * (0.9 + 0.2 * _Y[..., None] / SIZE)
    scale = rng.uniform(0.8, 1.1)
    cx, cy = SIZE / 2 + rng.uniform(-3, 3), SIZE / 2 + rng.uniform(-3, 3)
    flip = 1 if rng.random() < 0.5 else -1  # objects face either way
    frame = _Frame(flip * (_X - cx) / scale, (_Y - cy) / scale)
    colour = np.asarray(palette[rng.integers(len(palette))]) + rng.uniform(-20, 20, 3)
    for mask, shade in _object(label, frame, rng):
        img[mask] = np.clip(colour * shade, 0, 255)
    drawn: np.ndarray = np.clip(img, 0, 255).astype(np.float32)
    return drawn


def make_template_bank(seed: int, variants: int = VARIANTS_PER_CLASS) -> np.ndarray:
    """uint8 [10, variants, 32, 32, 3]: the only scenes ever drawn from scratch."""
    bank = draw_bank(seed, 0xC1FA, _draw, classes=NUM_CLASSES, variants=variants)
    return np.round(bank).astype(np.uint8)


@shared_read_only
def _shared_bank(seed: int) -> np.ndarray:
    """The bank of ``seed``, read-only and drawn once per process, since drawing it is most of construction."""
    return make_template_bank(seed)


class SyntheticCifar(AugmentedItems):
    """Synthetic CIFAR-10-shaped map-style dataset; see the module docstring for its invariants."""

    def __init__(self, length: int = 50000, *, seed: int = 0, augment: bool = True, epoch: int = 0) -> None:
        super().__init__(length, seed=seed, num_classes=NUM_CLASSES, augment=augment, epoch=epoch)
        self._bank = _shared_bank(seed)

    def raw(self, index: int) -> tuple[np.ndarray, int]:
        """Un-augmented uint8 [32, 32, 3] image and label of item ``index``."""
        label = self.label(index)
        rng = self.item_rng(index)
        base = self._bank[label, rng.integers(VARIANTS_PER_CLASS)]
        gain = rng.uniform(0.8, 1.2, 3).astype(np.float32)
        img = base * gain + rng.standard_normal(base.shape, np.float32) * 8.0
        return np.clip(img, 0, 255).astype(np.uint8), label

    def shift_flip_params(self, index: int) -> tuple[int, int, bool]:
        """The augmentation of item ``index`` at the current epoch: (dy, dx) in -3..3 px and a horizontal flip."""
        dy, dx, flip = self.augment_rng(index).integers((-SHIFT, -SHIFT, 0), (SHIFT + 1, SHIFT + 1, 2))
        return int(dy), int(dx), bool(flip)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        # the loader's stages (pipelines.stages, timed in a stallscope run only): drawing the item stands in for
        # reading it (fetch), the shift and flip are the augmentation, the float conversion the decode
        with stages.timed("fetch"):
            img, label = self.raw(index)
        if self.augmenting:
            with stages.timed("augment"):
                dy, dx, flip = self.shift_flip_params(index)
                # Edge padding then a shifted crop is Keras's fill_mode="nearest" shift for whole pixels.
                padded = np.pad(img, ((SHIFT, SHIFT), (SHIFT, SHIFT), (0, 0)), mode="edge")
                img = padded[SHIFT - dy : SHIFT - dy + SIZE, SHIFT - dx : SHIFT - dx + SIZE]
                if flip:
                    img = img[:, ::-1]
        with stages.timed("decode"):
            x = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1), np.float32) / np.float32(255.0))
            return x, torch.tensor(label, dtype=torch.int64)


class CifarVGG(nn.Module):
    """Keras ``cifar10_cnn``: [conv same, conv valid, pool, dropout] x2 (32, 64 filters), dense 512, dense 10."""

    def __init__(self, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(inplace=True),  # 32 -> 32
            nn.Conv2d(32, 32, 3), nn.ReLU(inplace=True),  # 32 -> 30
            nn.MaxPool2d(2), nn.Dropout(0.25),  # 30 -> 15
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(inplace=True),  # 15 -> 15
            nn.Conv2d(64, 64, 3), nn.ReLU(inplace=True),  # 15 -> 13
            nn.MaxPool2d(2), nn.Dropout(0.25),  # 13 -> 6
        )  # fmt: skip
        self.classifier = nn.Sequential(
            nn.Flatten(),
            nn.Linear(64 * 6 * 6, 512), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(512, num_classes),
        )  # fmt: skip
        keras_init(self)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.classifier(self.features(x))
        return logits


# Sized for a 10-30 s default run on the project's 2-core CPU host. Measured there with `stallscope run
# cifar-vgg` (torch 2.14.1, 2 threads, batch 32, workers=0, augmentation in the main process, plain SGD
# momentum 0.9, host otherwise idle): 5 + 200 steps at 71.9 ms/step (12.2 ms of it loading and augmenting,
# ~0.38 ms per item; 59.6 ms compute), 445 samples/s, 14.4 s measured, 21.4 s for the whole command. An
# earlier idle run averaged 100 ms/step: the host's speed varies by ~1.4x between idle runs.
STEPS = 200
WARMUP = 5
# lr 0.03 is for the runner's SGD (the Keras example uses RMSprop at 1e-4): measured, 150 steps reach ~65 %
# held-out accuracy; 0.05 and up make the first steps erratic.
LR = 0.03

SCENARIO = Scenario(
    name="cifar-vgg",
    dataset=SyntheticCifar,
    model=CifarVGG,
    loss=cross_entropy,
    batch_size=32,
    description="VGG-like CNN (Keras cifar10_cnn) on synthetic CIFAR-10-shaped 32x32 RGB data, shift+flip augmentation",
    steps=STEPS,
    warmup=WARMUP,
    lr=LR,
    extra={
        "classes": CLASSES,
        "augmentation": "shift ±3 px (10%) with nearest fill + horizontal flip p=0.5 (Keras ImageDataGenerator)",
        "data": "synthetic procedural scenes (32 templates/class, per-channel gain, noise)",
    },
)
