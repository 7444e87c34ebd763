"""The texts of RULER's synthetic tasks (Hsieh et al. 2024, arXiv 2404.06654, App. B; NVIDIA/RULER
scripts/data/synthetic/constants.py), in English as RULER writes them and in Chinese, written here to say the same.

Each task's text is a ``template`` (with ``{context}`` and the task's fields), an ``answer_prefix`` (appended to the
input: the model continues it) and the pieces its answer is written with (``sep`` between values, ``end`` after the
last). Data, not code: the generators in this package fill them.
"""
from __future__ import annotations

# RULER's noise haystack (niah.py, variable_tracking.py: type_haystack "noise"); one repetition is one "sentence"
NOISE = {
    "en": "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.",
    "zh": "草是绿的。天是蓝的。太阳是黄的。我们出发了。去了又回来。",
}

NIAH = {  # {type_v}: "number(s)"; {query}: the key(s) asked for
    "en": {
        "needle": "One of the special magic {type_v} for {key} is: {value}.",
        "template": "Some special magic {type_v} are hidden within the following text. Make sure to memorize it. I "
                    "will quiz you about the {type_v} afterwards.\n{context}\nWhat are all the special magic {type_v} "
                    "for {query} mentioned in the provided text?",
        "answer_prefix": " The special magic {type_v} for {query} mentioned in the provided text are",
        "type_v": {"numbers": ("number", "numbers")},
        "join_keys": (", ", ", and "),
        "sep": ", ", "lead": " ", "end": ".",
    },
    "zh": {
        "needle": "{key}的一个特别的神奇{type_v}是：{value}。",
        "template": "下面的文字里藏着一些特别的神奇{type_v}。请记住它们。之后我会问你这些{type_v}。\n{context}\n"
                    "上文中提到的{query}的所有特别的神奇{type_v}是什么？",
        "answer_prefix": "上文中提到的{query}的特别的神奇{type_v}是：",
        "type_v": {"numbers": ("数字", "数字")},
        "join_keys": ("、", "和"),
        "sep": "，", "lead": "", "end": "。",
    },
}

VT = {
    "en": {
        "assign_value": "VAR {var} = {value}",
        "assign_var": "VAR {var} = VAR {prev} ",
        "template": "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n"
                    "{context}\nQuestion: Find all variables that are assigned the value {query} in the text above.",
        "answer_prefix": " Answer: According to the chain(s) of variable assignment in the text above, {num_v} "
                         "variables are assigned the value {query}, they are: ",
        "sep": " ", "lead": "", "end": "",
    },
    "zh": {
        "assign_value": "VAR {var} = {value}",
        "assign_var": "VAR {var} = VAR {prev} ",
        "template": "记住并追踪下面文字中藏着的变量赋值链。\n\n{context}\n问题：找出上文中被赋值为{query}的所有变量。",
        "answer_prefix": "回答：根据上文中的变量赋值链，共有{num_v}个变量被赋值为{query}，它们是：",
        "sep": " ", "lead": "", "end": "",
    },
}

CWE = {
    "en": {
        "template": "Below is a numbered list of words. In these words, some appear more often than others. Memorize "
                    "the ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the "
                    "above list?",
        "answer_prefix": " Answer: The top 10 words that appear most often in the list are:",
        "item": "{i}. {word}", "item_sep": " ",
    },
    "zh": {
        "template": "下面是一个编了号的词表。其中有些词比别的词出现得多。记住出现最多的那些词。\n{context}\n"
                    "问题：上面的词表里最常见的10个词是哪些？",
        "answer_prefix": "回答：词表里出现最多的10个词是：",
        "item": "{i}. {word}", "item_sep": " ",
    },
}

FWE = {
    "en": {
        "template": "Read the following coded text and track the frequency of each coded word. Find the three most "
                    "frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please "
                    "ignore the dots '....'. What are the three most frequently appeared words in the above coded "
                    "text?",
        "answer_prefix": " Answer: According to the coded text above, the three most frequently appeared words are:",
        "sep": " ", "lead": " ", "end": "",
    },
    "zh": {
        "template": "阅读下面的编码文字，记下每个编码词出现的次数。找出出现最多的三个编码词。{context}\n"
                    "问题：不要解释。请忽略点号'....'。上面的编码文字里出现最多的三个词是哪些？",
        "answer_prefix": "回答：根据上面的编码文字，出现最多的三个词是：",
        "sep": " ", "lead": " ", "end": "",
    },
}

# A sample English sentence: a tokenizer that spends more than half a token a character on it does not write English
# words (the tiny default's byte-level vocabulary), so ``--lang auto`` gives it the Chinese texts.
ENGLISH_PROBE = "The special magic number for the quiet garden is mentioned in the provided text."
