"""Figure 5: the built-in token estimate against real tokenizers, per content class.

Run: python bench/estimate_accuracy.py   (needs the bench extras: bpe-openai, tokenizers)

Tokenizers that work offline: cl100k_base and o200k_base (bundled by
``bpe-openai``) and the legacy Claude tokenizer (``tokenizer.json`` inside the
``anthropic==0.25.0`` wheel, fetched from PyPI into a cache folder the first
time). The signed error is (estimate - tokens) / tokens against the *largest*
of the three counts, so a negative figure means the estimate undercounts for
at least one real tokenizer (the context would overflow before compaction fires).
"""

from __future__ import annotations

import base64
import inspect
import random
import subprocess
import sys
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.workloads import load_transcripts
from langchain_compaction.tokens import estimate_tokens

CACHE = Path(__file__).resolve().parent / ".cache"

RUSSIAN = [
    "Компактизация контекста позволяет длинным разговорам с языковой моделью оставаться в пределах "
    "контекстного окна. Старые сообщения заменяются кратким изложением, а последние сообщения "
    "сохраняются без изменений. Пользователь попросил не удалять файл конфигурации и сохранить все "
    "пути к файлам в точности.",
    "Мы проверили реализацию на шести реальных журналах агентов. В каждом журнале встречаются вызовы "
    "инструментов, длинные результаты и ошибки компиляции. Следующий шаг — исправить функцию разбора "
    "аргументов и запустить тесты ещё раз, чтобы убедиться, что ничего не потеряно.",
    "Сервер отвечает с задержкой около двух секунд, когда в очереди больше тысячи задач. Нужно "
    "выяснить, где именно теряется время: в базе данных, в сериализации или в сетевом слое. "
    "Пожалуйста, не меняйте публичный интерфейс модуля и оставьте старые тесты как есть.",
]
CHINESE = [
    "上下文压缩让与语言模型的长对话保持在上下文窗口之内。较早的消息被替换为简明的摘要，"
    "而最近的消息保持不变。用户要求不要删除配置文件，并且准确保留所有文件路径。",
    "我们在六个真实的智能体记录上测试了这个实现。每个记录中都有工具调用、很长的结果和编译错误。"
    "下一步是修复参数解析函数，然后再次运行测试，确保没有任何内容丢失。",
    "当队列中有一千多个任务时，服务器的响应会延迟大约两秒。需要找出时间究竟耗在哪里："
    "数据库、序列化还是网络层。请不要修改模块的公共接口，并保留原有的测试。",
]


def samples() -> dict[str, list[str]]:
    transcripts = load_transcripts()
    prose = [
        m.content
        for msgs in transcripts.values()
        for m in msgs
        if m.type in ("human", "ai")
        and isinstance(m.content, str)
        and m.content.count(" ") > 20
        and "```" not in m.content
        and "{" not in m.content
    ]
    import asyncio.base_events
    import json.decoder
    import textwrap

    import langchain_compaction.core.cut as cut

    code = [inspect.getsource(mod) for mod in (json.decoder, asyncio.base_events, textwrap, cut)]
    tool_json = []
    for msgs in transcripts.values():
        data = [{"type": m.type, "content": m.content, "name": getattr(m, "name", None)} for m in msgs[:12]]
        tool_json.append(json.dumps(data, indent=2, ensure_ascii=False))
        tool_json.append(json.dumps(data, ensure_ascii=False))
    rng = random.Random(7)
    b64 = [base64.b64encode(bytes(rng.randrange(256) for _ in range(3000))).decode() for _ in range(3)]
    return {
        "English prose": prose,
        "source code": code,
        "JSON tool results": tool_json,
        "Russian text": RUSSIAN,
        "Chinese text": CHINESE,
        "base64": b64,
    }


def claude_tokenizer():
    from tokenizers import Tokenizer

    path = CACHE / "claude-tokenizer.json"
    if not path.exists():
        CACHE.mkdir(exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "anthropic==0.25.0", "-d", str(CACHE)],
            check=True,
        )
        wheel = next(CACHE.glob("anthropic-0.25.0-*.whl"))
        with zipfile.ZipFile(wheel) as zf:
            path.write_bytes(zf.read("anthropic/tokenizer.json"))
    return Tokenizer.from_file(str(path))


def measure() -> list[dict[str, object]]:
    import bpe_openai

    claude = claude_tokenizer()
    counters = {
        "cl100k": bpe_openai.get_encoding("cl100k_base").encode,
        "o200k": bpe_openai.get_encoding("o200k_base").encode,
        "claude-legacy": lambda s: claude.encode(s).ids,
    }
    rows = []
    for name, texts in samples().items():
        chars = sum(len(t) for t in texts)
        real = {k: sum(len(f(t)) for t in texts) for k, f in counters.items()}
        worst = max(real.values())
        ours = sum(estimate_tokens(t) for t in texts)
        reference = sum(len(t.encode("utf-8")) // 4 for t in texts)  # Go's len() counts bytes
        rows.append(
            {
                "class": name,
                "chars": chars,
                **{f"tokens_{k}": v for k, v in real.items()},
                "estimate": ours,
                "estimate_error": (ours - worst) / worst,
                "reference": reference,
                "reference_error": (reference - worst) / worst,
            }
        )
    return rows


def main() -> None:
    rows = measure()
    print(
        f"{'class':18} {'chars':>8} {'cl100k':>8} {'o200k':>8} {'claude':>8} {'estimate':>9} {'error':>7} {'4 chars':>8} {'error':>7}"
    )
    for r in rows:
        print(
            f"{r['class']:18} {r['chars']:>8,} {r['tokens_cl100k']:>8,} {r['tokens_o200k']:>8,} "
            f"{r['tokens_claude-legacy']:>8,} {r['estimate']:>9,} {r['estimate_error']:>+7.0%} "
            f"{r['reference']:>8,} {r['reference_error']:>+7.0%}"
        )


if __name__ == "__main__":
    main()
