"""Built-in scenarios ``fasttext-imdb`` and ``bilstm-imdb``: the seed's two IMDB text models on synthetic reviews.

From the seed (a CPU-vs-GPU cost-per-epoch comparison of the Keras examples): ``imdb_fasttext`` (embedding
50, global average pooling, one output; run with its default ``ngram_range = 1``, so no bigram features and
no hashing here either) on reviews cut to 400 tokens, and ``imdb_bidirectional_lstm`` (embedding 128,
bidirectional LSTM 64, dropout 0.5, one output) on reviews cut to 100 tokens; both batch 32, vocabulary
20,000. The single sigmoid output becomes two logits under softmax cross-entropy here, which is the same
model up to parametrisation. fastText does almost no compute per item, so its loading cost shows; the
LSTM's compute is a chain of 100 small sequential steps, a poor fit for a wide accelerator.

The data is SYNTHETIC, never downloaded: Keras ships IMDB already tokenised as word ids ranked by
frequency, so a review here is a sequence of ids as well. Ids 0, 1, 2 are padding, start and
out-of-vocabulary as in Keras; ids 3..19,999 are words. Filler words follow a Zipf law over their ids (low
id = frequent, like Keras's ranks). The label is encoded by 100 "positive" and 100 "negative" sentiment
words (fixed per seed, drawn from frequency ranks 30..3,000, and Zipf-distributed within their set, so a few
of them, the "great" and "worst", carry most of the signal): a review of label ``y`` uses sentiment words at
a per-review rate of 3-10 %, 75 % of them from its own class's set. Counting own-class against other-class
sentiment words classifies ~91 % of the 400-token reviews and ~84 % of the 100-token ones, close to what a
linear model reaches on the real IMDB: learnable, not trivial.

Invariants:
- Construction is cheap (< 1 s): only the Zipf table and the two sentiment sets are built; review ``i`` is
  generated on access. Generation (length draw, Zipf draws, sentiment substitution, pre-padding or
  pre-truncation as Keras's ``pad_sequences`` does) is the per-item "tokenisation" cost; Keras itself pays
  almost nothing per item because it pads the whole array once up front.
- Review ``i`` is a pure function of ``(seed, i)``, whatever the worker count, access order or ``maxlen``
  (a longer ``maxlen`` shows more of the same review), from a generator seeded by those values, never from
  the global or per-worker RNG. There is no augmentation, hence no ``set_epoch``.
- Items are ``(int64 tensor [maxlen] of ids in 0..19,999, int64 label in {0, 1})``; labels are balanced.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import torch
from torch import nn

from pipelines import stages
from scenarios.base import Scenario
from scenarios.common import SeededItems, cross_entropy

VOCAB = 20000
PAD, START, OOV = 0, 1, 2
FIRST_WORD = 3
NUM_CLASSES = 2
SENTIMENT_WORDS = 100  # per class
# Sentiment words are drawn from these frequency ranks: common enough to appear, rare enough not to be "the".
SENTIMENT_RANKS = (30, 3000)
# Per-review share of sentiment words, drawn uniformly in this range.
SENTIMENT_RATE = (0.03, 0.10)
# Share of a review's sentiment words taken from its own class's set; the rest come from the other set.
AGREEMENT = 0.75
ZIPF_EXPONENT = 1.07
# IMDB review lengths in words: median ~174, mean ~234, long right tail; a log-normal fits them well.
LENGTH_LOG_MEAN, LENGTH_LOG_STD, MIN_LENGTH = 5.2, 0.6, 10
FASTTEXT_MAXLEN = 400
BILSTM_MAXLEN = 100


class SyntheticReviews(SeededItems):
    """Synthetic IMDB-shaped map-style dataset of token ids; see the module docstring for its invariants."""

    def __init__(self, length: int = 25000, *, maxlen: int = FASTTEXT_MAXLEN, seed: int = 0) -> None:
        if maxlen < 1:
            raise ValueError(f"maxlen must be >= 1, got {maxlen}")
        super().__init__(length, seed=seed, num_classes=NUM_CLASSES)
        self.maxlen = maxlen
        words = np.arange(FIRST_WORD, VOCAB)
        weights = 1.0 / (words - FIRST_WORD + 1.0) ** ZIPF_EXPONENT
        # Inverse-CDF sampling: one searchsorted per review instead of a Python-level loop per word.
        self._cdf = np.cumsum(weights / weights.sum())
        self._cdf[-1] = 1.0  # rounding must not leave a uniform draw above the last bucket
        picked = np.random.default_rng([seed, 0x5E47]).choice(
            np.arange(FIRST_WORD + SENTIMENT_RANKS[0], FIRST_WORD + SENTIMENT_RANKS[1]), 2 * SENTIMENT_WORDS, False
        )
        # Row c: the words that signal class c (0 negative, 1 positive).
        self.sentiment = picked.reshape(NUM_CLASSES, SENTIMENT_WORDS)
        # Within a set, sentiment words are Zipf-distributed too: a few ("great", "worst") carry most of it.
        weights = 1.0 / np.arange(1.0, SENTIMENT_WORDS + 1)
        self._sentiment_cdf = np.cumsum(weights / weights.sum())
        self._sentiment_cdf[-1] = 1.0

    def review(self, index: int) -> tuple[np.ndarray, int]:
        """The whole review of item ``index`` (int64 ids, starting with ``START``, unpadded) and its label."""
        label = self.label(index)
        rng = self.item_rng(index)
        n = max(MIN_LENGTH, int(rng.lognormal(LENGTH_LOG_MEAN, LENGTH_LOG_STD)))
        ids = FIRST_WORD + np.searchsorted(self._cdf, rng.random(n), side="right")
        # Filler words can collide with sentiment words by chance; that is noise real reviews have too.
        hits = rng.random(n) < rng.uniform(*SENTIMENT_RATE)
        k = int(hits.sum())
        side = np.where(rng.random(k) < AGREEMENT, label, 1 - label)
        ids[hits] = self.sentiment[side, np.searchsorted(self._sentiment_cdf, rng.random(k), side="right")]
        return np.concatenate(([START], ids)).astype(np.int64), label

    def __getitem__(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        # the loader's stages (pipelines.stages, timed in a stallscope run only): drawing the review stands in for
        # reading it (fetch), padding it to a fixed length is the decode; nothing is augmented
        with stages.timed("fetch"):
            ids, label = self.review(index)
        with stages.timed("decode"):
            # Keras pad_sequences defaults: padding="pre" and truncating="pre" (the review's end is kept).
            out = np.full(self.maxlen, PAD, np.int64)
            tail = ids[-self.maxlen :]
            out[self.maxlen - len(tail) :] = tail
            return torch.from_numpy(out), torch.tensor(label, dtype=torch.int64)


class FastText(nn.Module):
    """Keras ``imdb_fasttext``: embedding 50 averaged over the review (padding excluded), then linear to 2."""

    def __init__(self, vocab: int = VOCAB, dim: int = 50, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        # EmbeddingBag fuses lookup and mean; padding_idx leaves padding out of the mean, so the average is
        # over the review's words rather than diluted by its length (Keras averages the padding in too).
        self.embedding = nn.EmbeddingBag(vocab, dim, mode="mean", padding_idx=PAD)
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.fc(self.embedding(ids))
        return logits


class BiLSTM(nn.Module):
    """Keras ``imdb_bidirectional_lstm``: embedding 128, bidirectional LSTM 64, dropout 0.5, linear to 2."""

    def __init__(self, vocab: int = VOCAB, dim: int = 128, hidden: int = 64, num_classes: int = NUM_CLASSES) -> None:
        super().__init__()
        self.embedding = nn.Embedding(vocab, dim)
        self.lstm = nn.LSTM(dim, hidden, batch_first=True, bidirectional=True)
        self.dropout = nn.Dropout(0.5)
        self.fc = nn.Linear(2 * hidden, num_classes)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # As Keras's Bidirectional(LSTM(64)): the forward direction's last state and the backward
        # direction's last state (at position 0), concatenated. No masking, as in the example.
        _, (h_n, _) = self.lstm(self.embedding(ids))
        logits: torch.Tensor = self.fc(self.dropout(torch.cat((h_n[-2], h_n[-1]), dim=1)))
        return logits


# Sized for a 10-30 s default run on the project's 2-core CPU host. Measured there with `stallscope run NAME`
# (torch 2.14.1, 2 threads, batch 32, workers=0, plain SGD momentum 0.9, host otherwise idle):
# fasttext-imdb 20 + 800 steps: 12.1 ms/step (6.5 ms of it generating the reviews, ~0.2 ms each; 5.5 ms
#   compute), 2,640 samples/s, 9.7 s measured, 15.9 s for the whole command: loader-bound (stall ~55 %).
FASTTEXT_STEPS = 800
FASTTEXT_WARMUP = 20
# bilstm-imdb 10 + 300 steps: 53.2 ms/step (6.6 ms loading, 46.5 ms compute), 600 samples/s, 16.0 s
#   measured, 22.1 s for the whole command.
# Learning: with the runner's SGD (the Keras examples use Adam) fastText at lr 0.5 reaches ~86 % held-out
# accuracy in 300 steps. The BiLSTM's loss stays near ln 2 for a default run at any lr tried (0.05-3, torch
# or Keras initialisation); even Adam only starts to move it after ~300 steps. It trains, it is timed
# faithfully, it does not converge in a default run.
BILSTM_STEPS = 300
BILSTM_WARMUP = 10

_DATA_NOTE = (
    "synthetic reviews: Zipf filler over 20,000 ids, sentiment words at 3-10 % (75 % agreeing with the label), "
    "log-normal lengths, pre-padded/truncated; no augmentation"
)

FASTTEXT_IMDB = Scenario(
    name="fasttext-imdb",
    dataset=partial(SyntheticReviews, maxlen=FASTTEXT_MAXLEN),
    model=FastText,
    loss=cross_entropy,
    batch_size=32,
    description="fastText (Keras imdb_fasttext, unigrams) on synthetic IMDB-shaped reviews of 400 token ids",
    steps=FASTTEXT_STEPS,
    warmup=FASTTEXT_WARMUP,
    lr=0.5,
    extra={"data": _DATA_NOTE, "maxlen": FASTTEXT_MAXLEN, "ngrams": 1, "keras_example": "imdb_fasttext"},
)

BILSTM_IMDB = Scenario(
    name="bilstm-imdb",
    dataset=partial(SyntheticReviews, maxlen=BILSTM_MAXLEN),
    model=BiLSTM,
    loss=cross_entropy,
    batch_size=32,
    description="bidirectional LSTM (Keras imdb_bidirectional_lstm) on synthetic IMDB-shaped reviews of 100 ids",
    steps=BILSTM_STEPS,
    warmup=BILSTM_WARMUP,
    lr=0.05,
    extra={"data": _DATA_NOTE, "maxlen": BILSTM_MAXLEN, "keras_example": "imdb_bidirectional_lstm"},
)
