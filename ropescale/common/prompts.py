"""Every prompt text of the project, in one place (CNNSum, arXiv 2412.02819, Appendix F).

Two families:
- Baseline prompts (Appendix F.1), used to evaluate models zero-shot: ``ie`` and ``ib``.
  Two wordings are offered (``style``):
    * ``release`` (default): the strings of the official CNNSum release (what produced the paper's numbers).
      Its Prompt-IB is character-for-character the CLongEval-LStSum prompt (zexuanqiu/CLongEval
      ``config/dataset2prompt.json``, "long_story_summarization"), from which the paper says it was copied.
    * ``paper``: Appendix F.1 as printed in the paper, with full-width punctuation restored (the PDF text
      extraction turns '，' '：' into ASCII). Prompt-IB is identical in both; Prompt-IE differs in wording
      ("节选如下" / "阅读以上节选" and one newline before "摘要：" in the paper).
- Fine-tuning prompts (Appendix F.2): ``ft-ie`` and ``ft-ib`` with the ``[原文_开始]`` / ``[原文_结束]`` /
  ``[摘要]`` markers. data_concat renders training samples with exactly these strings and eval_summ uses the same
  ones to evaluate fine-tuned models, so training and evaluation prompts cannot drift apart.

``{}`` in a template stands for the context. A prompt ends where the model's summary begins.
"""
from __future__ import annotations

from .io import InputError

# Appendix F.1 — official release strings (default).
RELEASE_IE = "下面是一个小说节选，内容如下：\n\n{}\n\n请你阅读以上内容后写出相应的摘要，不要输出其他任何内容。\n\n摘要："  # noqa: E501  (verbatim)
RELEASE_IB = "下面是一个小说节选，请你阅读后写出相应的摘要，不要输出其他任何内容。\n小说节选如下：\n\n{}\n\n摘要："
# Appendix F.1 — as printed in the paper.
PAPER_IE = "下面是一个小说节选，节选如下：\n\n{}\n\n请你阅读以上节选后写出相应的摘要，不要输出其他任何内容。\n摘要："
PAPER_IB = RELEASE_IB

# Appendix F.2 — fine-tuning prompts (also used to evaluate fine-tuned models).
CONTEXT_START = "[原文_开始]"
CONTEXT_END = "[原文_结束]"
SUMMARY_MARK = "[摘要]"
_FT_INSTRUCTION_IB = f"以下{CONTEXT_START}{CONTEXT_END}之中的内容来自一本小说，请对其进行摘要。"
_FT_INSTRUCTION_IE = f"以上{CONTEXT_START}{CONTEXT_END}之中的内容来自一本小说，请对其进行摘要。"
FT_IB = f"{_FT_INSTRUCTION_IB}\n{CONTEXT_START}\n{{}}\n{CONTEXT_END}\n\n{SUMMARY_MARK}\n"
FT_IE = f"{CONTEXT_START}\n{{}}\n{CONTEXT_END}\n\n{_FT_INSTRUCTION_IE}\n{SUMMARY_MARK}\n"

PROMPT_TYPES = ("ie", "ib", "ft-ie", "ft-ib")
STYLES = ("release", "paper")

_TEMPLATES = {
    ("release", "ie"): RELEASE_IE,
    ("release", "ib"): RELEASE_IB,
    ("paper", "ie"): PAPER_IE,
    ("paper", "ib"): PAPER_IB,
}

# Instruction sentences and markers whose presence in a prediction means the model echoed its prompt
# (a failure mode of the paper's Sec 4). Used by evaluation's failure-mode detector.
INSTRUCTION_FRAGMENTS = (
    "请你阅读以上内容后写出相应的摘要",
    "请你阅读以上节选后写出相应的摘要",
    "请你阅读后写出相应的摘要",
    "不要输出其他任何内容",
    "小说节选如下",
    "下面是一个小说节选",
    "之中的内容来自一本小说",
    "请对其进行摘要",
    CONTEXT_START,
    CONTEXT_END,
    SUMMARY_MARK,
)


def template(prompt: str, style: str = "release") -> str:
    """The template (``{}`` = context) for a prompt type: ie, ib (baseline, by ``style``), ft-ie, ft-ib."""
    prompt = prompt.lower()
    if prompt == "ft-ie":
        return FT_IE
    if prompt == "ft-ib":
        return FT_IB
    if style not in STYLES:
        raise InputError(f"unknown prompt style {style!r} (choose from {', '.join(STYLES)})")
    try:
        return _TEMPLATES[(style, prompt)]
    except KeyError:
        raise InputError(f"unknown prompt type {prompt!r} (choose from {', '.join(PROMPT_TYPES)})") from None


def render(context: str, prompt: str, style: str = "release") -> str:
    """The model input for ``context``: everything up to where the summary starts."""
    return template(prompt, style).replace("{}", context, 1)


def split_template(prompt: str, style: str = "release") -> tuple[str, str]:
    """(text before the context, text after it): lets callers tokenize the context separately to trim it."""
    head, _, tail = template(prompt, style).partition("{}")
    return head, tail


def prompt_kind(prompt: str) -> str:
    """'IE' or 'IB' (the paper's names), for reports."""
    return "IE" if prompt.lower().endswith("ie") else "IB"
