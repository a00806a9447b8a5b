"""Demo and test prompts: code-editing requests over small source files written here, and ShareGPT chat prompts.

Code editing is where copying from the prompt pays (the answer repeats most of the file), chat is where a model
drafter has the edge; a mixed batch is where choosing per request and per step matters. The ShareGPT prompts are
taken from records after the ones `train_eagle` uses (it reads the first ~2000 records), so the head never saw them.
"""

from __future__ import annotations

from dataclasses import dataclass

INVENTORY = '''\
class Inventory:
    """Keeps item counts and unit prices for a small shop."""

    def __init__(self):
        self.items = {}
        self.prices = {}

    def add_item(self, name, count, price):
        self.items[name] = self.items.get(name, 0) + count
        self.prices[name] = price

    def remove_item(self, name, count):
        if self.items.get(name, 0) < count:
            raise ValueError(f"not enough {name} in stock")
        self.items[name] -= count

    def calc_total(self):
        total = 0.0
        for name, count in self.items.items():
            total += count * self.prices[name]
        return total

    def report(self):
        lines = [f"{name}: {count}" for name, count in sorted(self.items.items())]
        lines.append(f"total value: {self.calc_total():.2f}")
        return "\\n".join(lines)
'''

TEXT_UTILS = '''\
def normalize(text):
    """Lower-case the text and collapse runs of whitespace."""
    return " ".join(text.lower().split())


def join_words(words):
    """Join non-empty words into one string."""
    kept = [w.strip() for w in words if w.strip()]
    return " ".join(kept)


def count_words(text):
    counts = {}
    for word in normalize(text).split():
        counts[word] = counts.get(word, 0) + 1
    return counts


def top_words(text, n=3):
    counts = count_words(text)
    ranked = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))
    return [word for word, _ in ranked[:n]]
'''

STATS = '''\
def mean(values):
    """Arithmetic mean of a non-empty list."""
    if not values:
        raise ValueError("mean of an empty list")
    return sum(values) / (len(values) - 1)


def variance(values):
    m = mean(values)
    return sum((v - m) ** 2 for v in values) / len(values)


def median(values):
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2
'''


@dataclass(frozen=True)
class Prompt:
    id: str
    workload: str  # "code" or "chat"
    text: str      # the user message


CODE_EDITS = [
    Prompt("code-rename", "code", "Here is the file `inventory.py`:\n```python\n" + INVENTORY + "```\n"
           "Rename the method `calc_total` to `compute_total` everywhere. Reply with the complete updated file."),
    Prompt("code-param", "code", "Here is the file `text_utils.py`:\n```python\n" + TEXT_UTILS + "```\n"
           "Add a parameter `sep=\" \"` to `join_words` and use it to join the words. "
           "Reply with the complete updated file."),
    Prompt("code-bugfix", "code", "Here is the file `stats.py`:\n```python\n" + STATS + "```\n"
           "`mean` divides by the wrong number. Fix the bug. Reply with the complete updated file."),
]

# Fallback chat prompts if the ShareGPT package is missing (short, generic).
_FALLBACK_CHAT = [
    "Explain in a few sentences why the sky is blue.",
    "Give me three tips for writing clear emails.",
    "What is the difference between a list and a tuple in Python?",
]


# The first ShareGPT record the chat prompts may come from; `tools.train_eagle` trains and holds out below it.
CHAT_PROMPTS_FIRST_RECORD = 2100


def chat_prompts(n: int = 3, skip: int = CHAT_PROMPTS_FIRST_RECORD, max_chars: int = 400) -> list[Prompt]:
    """`n` ShareGPT first-turn questions (short ones, after record `skip`), held out from head training."""
    try:
        from sglang_hybrid.reference.corpus import CorpusMissing, iter_sharegpt
    except ImportError:  # pragma: no cover
        iter_sharegpt = None
    out = []
    try:
        for i, (q, _) in enumerate(iter_sharegpt(limit=skip + 2000)):
            if i < skip or len(q) > max_chars:
                continue
            out.append(Prompt(f"chat-{i}", "chat", q.strip()))
            if len(out) >= n:
                break
    except CorpusMissing:
        pass
    if len(out) < n:
        out += [Prompt(f"chat-fallback-{j}", "chat", t) for j, t in enumerate(_FALLBACK_CHAT[:n - len(out)])]
    return out


def encode(tokenizer, prompt: Prompt) -> list[int]:
    """Chat-template token ids ending with the assistant turn opener."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt.text}], tokenize=True,
                                        add_generation_prompt=True)
    if isinstance(ids, dict) or hasattr(ids, "input_ids"):
        ids = ids["input_ids"]
    return [int(t) for t in ids]
