"""Failure-mode detectors on hand-made examples of each case (CNNSum Sec 4.4 / Appendix E), both ways."""
from __future__ import annotations

import json

import pytest

from ropescale.common.paths import DATA_DIR
from ropescale.evaluation import failure_modes as F

# Appendix E.4 Case 1, Yi-1.5-34B-Chat-16K (meaningless repetition + instruction-like echo), abridged
E4_REPEAT = ("杜少甫在古天宗内横扫三大商行, 重创众多弟子, 随后在天下阁外与曹肇等人交手。 \"\n\n 请注意, 摘要应简洁明了, "
             "仅包含关键信息, 不包含任何无关内容。 摘要不应超过100个字。 摘要:杜少甫横扫三大商行, 重创弟子, 与曹肇等人交手, "
             "破阵斩曹肇臂, 宗中弟子震惊。 \"\n\n 请注意, 摘要应简洁明了, 仅包含关键信息, 不包含任何无关内容。 摘要不应超过100个字。 "
             "摘要:杜少甫横扫三大商行, 重创弟子, 与曹肇等人交手, 破阵斩曹肇臂, 宗中弟子震惊。 \"\n\n 请注意, 摘要应简洁明了, "
             "仅包含关键信息, 不包含任何无关内容。 摘要不应超过100个字。 摘要:杜少甫横扫三大商行, 重创弟子, 与曹肇等人交手, "
             "破阵斩曹肇臂, 宗中弟子震惊。")
# Appendix E.6, Llama3.1-70B with Prompt-IE: repeats the prompt's last sentence
E6_ECHO = "\n\n\n请你阅读以上节选后写出相应的摘要,不要输出其他任何内容。\n\n摘要:\n\n\n请你阅读以上节选后写出相应的摘要,不要输出其他任何内容。\n\n摘要:"
# Appendix E.3 Case 1, Qwen1.5-7B with Prompt-IE (a normal summary)
E3_NORMAL = ("阳旭在星元古坟场中,得到了玄元控水旗和阳极炼神丹。玄元控水旗是鸿途大陆的核心精华,与天花妙坠旗融合后,成为了完美道器。"
             "阳旭在风雷台上,连续斩杀龙印境五重的火道人和天星子,引起了学院的重视。阳旭得到了学院的奖励,但他的目标是天机门,"
             "想要进入蛮兽荒山。在蛮兽荒山,阳旭遇到了猛犸飞象,通过八相世界之巽风世界,降服了猛犸飞象。")


@pytest.fixture(scope="module")
def chapter(chapters):
    return chapters[5]


@pytest.mark.parametrize("text", ["", "   ", "\n\n\n", "....", "。。。", " . \n 。", "——……"])
def test_empty_positive(text):
    assert F.detect(text)["empty"] is True


@pytest.mark.parametrize("text", ["宝玉", "a", "1", "。好。", E3_NORMAL])
def test_empty_negative(text):
    assert F.detect(text)["empty"] is False


def test_copy_positive(chapter):
    t = chapter["text"]
    pred = t[1000:1400]  # a verbatim excerpt (E.3 "Copy From the Novel Excerpt")
    d = F.detect(pred, t)
    assert d["copy"] is True and d["copy_share"] == 1.0
    # copied with a few words of its own and different line breaks / punctuation width still counts
    mixed = "小说节选如下：\n\n" + pred.replace("，", ",")[:250] + "然后他们走了。"
    assert F.detect(mixed, t)["copy"] is True


def test_copy_negative(chapter):
    t = chapter["text"]
    # the chapter's own title (a summary by the author) and a real summary of another text are not copies
    assert F.detect(chapter["title"], t)["copy"] is False
    assert F.detect(E3_NORMAL, t)["copy"] is False
    # a summary reusing names and short phrases of the source stays below the threshold
    names = "".join(t[i:i + 4] + "，后来" for i in range(0, 400, 40))
    d = F.detect(names, t)
    assert d["copy"] is False and d["copy_share"] < F.COPY_THRESHOLD
    # without the context the copy check is unknown, not False
    assert F.detect(t[1000:1400])["copy"] is None


def test_copy_threshold_boundary():
    ctx = "甲乙丙丁戊己庚辛壬癸子丑寅卯辰巳午未申酉"
    own = "天地玄黄宇宙洪荒日月盈昃辰宿列张寒来暑往秋收冬藏"
    # 8-grams: verbatim part of k chars gives k-7 copied grams
    half = ctx[:15] + own[:8]  # 23 chars -> 16 grams, 8 copied (share 0.5)
    assert F.copy_share(half, ctx) == pytest.approx(8 / 16)
    assert F.detect(half, ctx)["copy"] is True
    less = ctx[:14] + own[:9]  # 16 grams, 7 copied
    assert F.detect(less, ctx)["copy"] is False


def test_repetition_positive():
    d = F.detect(E4_REPEAT)
    assert d["repetition"] is True and d["repetition_share"] > 0.5
    # E.5: the same sentence for every "段落 n"
    e5 = "".join(f"段落{i}: 韩立一听此言，心里一松，但随即又有些愕然。\n" for i in range(6, 20))
    assert F.detect(e5)["repetition"] is True
    # E.4 case 4: a list of names looping
    loop = "他遇到了很多女孩，包括吴茵、林墨、" + "范琪、汤晴、陈裴、王端端、沈城、" * 8
    assert F.detect(loop)["repetition"] is True


def test_repetition_negative():
    assert F.detect(E3_NORMAL)["repetition"] is False
    # restating one phrase once is not a loop
    once = E3_NORMAL + "阳旭在星元古坟场中,得到了玄元控水旗。"
    assert F.detect(once)["repetition"] is False
    assert F.detect("短")["repetition"] is False


def test_repetition_threshold_boundary():
    """A text of length L that is a loop of period P has L-P-n+1 of its L-n+1 n-grams repeated."""
    period = "天地玄黄宇宙洪荒日月盈昃辰宿列张寒来暑往"  # 20 distinct chars
    assert F.repetition_share(period) == 0.0
    two = period * 2  # L=40: 31 grams, 11 repeated
    assert F.repetition_share(two) == pytest.approx(11 / 31)
    assert F.detect(two)["repetition"] is True  # 0.355 >= 0.3
    under = period + period[:18]  # L=38: 29 grams, 9 repeated: 0.31 -> flagged; L=37: 8/28 = 0.286 -> not
    assert F.repetition_share(under) == pytest.approx(9 / 29) and F.detect(under)["repetition"] is True
    assert F.repetition_share(period + period[:17]) == pytest.approx(8 / 28)
    assert F.detect(period + period[:17])["repetition"] is False
    just_below = period + period[:5]  # no repeated 10-gram at all
    assert F.repetition_share(just_below) == 0.0


def test_echo_positive():
    d = F.detect(E6_ECHO)
    assert d["echo"] is True and "请你阅读以上节选后写出相应的摘要" in d["echo_fragments"]
    assert F.detect("[原文_开始]\n宝玉读书。")["echo"] is True  # fine-tuning markers
    assert F.detect("宝玉读书。\n[摘要]\n宝玉读书。")["echo"] is True
    assert F.detect("小说节选如下：\n\n宝玉读书")["echo"] is True  # E.3 IB case starts like this
    # the summary cue twice (Llama3.1-8B, E.6: "\n\n\n摘要:" over and over), ASCII or full-width colon
    assert F.detect("\n\n\n摘要:\n\n\n摘要：\n\n\n摘要:")["echo"] is True


def test_echo_negative():
    assert F.detect(E3_NORMAL)["echo"] is False
    assert F.detect("摘要：宝玉和黛玉在园中读书。")["echo"] is False  # one leading cue is not an echo
    assert F.detect("他写了一篇小说的摘要。")["echo"] is False


def test_rates():
    flags = [F.detect(""), F.detect(E4_REPEAT), F.detect(E6_ECHO), F.detect(E3_NORMAL, "无关的上下文" * 5)]
    r = F.rates(flags)
    assert r["n"] == 4
    assert r["empty"] == 1 / 4
    assert r["repetition"] == 2 / 4  # E4 and E6 (the echoed sentence loops too)
    assert r["echo"] == 2 / 4  # E4 contains "摘要:" three times, E6 the instruction
    assert r["copy"] == 0.0  # over the one prediction with a context
    assert F.rates([F.detect("a")])["copy"] is None


def test_real_commercial_summaries_are_clean():
    """690 real GPT-4-Turbo / Moonshot summaries (CLongEval): no empty, repetitive or echoing output, and none
    is a copy of the reference summary either."""
    rows = []
    for name in ("moonshot-v1_small.jsonl", "gpt4-turbo-128k_medium.jsonl"):
        rows += [json.loads(line) for line in (DATA_DIR / "clongeval" / name).read_text(encoding="utf-8").splitlines()]
    flags = [F.detect(r["prediction"], r["reference"]) for r in rows]
    r = F.rates(flags)
    assert r["n"] == 690
    assert r["empty"] == r["repetition"] == r["echo"] == r["copy"] == 0.0
