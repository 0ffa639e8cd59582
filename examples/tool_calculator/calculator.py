"""The calculator task of `--preset smollm2-tools` (docs/CUSTOM_TASKS.md, "Tools"): the product of two 3-digit
numbers, which a 135M model cannot compute in its head, and a `calculator` tool that can.

    python examples/tool_calculator/calculator.py      # rewrites products.jsonl (deterministic)

Referenced by file path (`examples/tool_calculator/calculator.py:calculator`), as reward functions are: this folder
need not be on the Python path. The tool parses its argument as arithmetic (integers, + - * /, parentheses) with
`ast` and evaluates that tree itself: nothing the model writes is executed.
"""

from __future__ import annotations

import ast
import json
import operator
import random
import re
from pathlib import Path

OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
MAX_DIGITS = 30
"""Numbers the calculator refuses beyond: a reply cannot make it compute 9**9**9."""
NUMBER = re.compile(r"-?\d+")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression of integers with +, -, * and /.

    Args:
        expression: The expression, e.g. "123 * 456".
    """
    def value(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            result = OPERATORS[type(node.op)](value(node.left), value(node.right))
            if abs(result) >= 10 ** MAX_DIGITS:
                raise ValueError("the result is too large")
            return result
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -value(node.operand)
        raise ValueError(f"not arithmetic: {ast.unparse(node)!r}; use integers with + - * /")

    result = value(ast.parse(expression.replace("x", "*").replace("×", "*"), mode="eval").body)
    return str(int(result)) if float(result).is_integer() else f"{result:.6g}"


def exact_answer(completions, answer, **kwargs):
    """TRL style: 1.0 when the last number of the final reply is the row's `answer`, else 0.0 (a reply that only
    calls the tool, or stops at the turn limit, has no answer)."""
    rewards = []
    for completion, gold in zip(completions, answer, strict=True):
        text = completion[-1]["content"] if isinstance(completion, list) else completion
        numbers = NUMBER.findall(text.replace(",", ""))
        rewards.append(1.0 if numbers and numbers[-1] == str(gold) else 0.0)
    return rewards


def make_rows(n: int = 400, seed: int = 0) -> list[dict]:
    """`n` distinct products of two 3-digit numbers; the target (the warm-up's demonstration) is the tool call."""
    rng, seen, rows = random.Random(seed), set(), []
    while len(rows) < n:
        a, b = rng.randint(100, 999), rng.randint(100, 999)
        if (a, b) in seen:
            continue
        seen.add((a, b))
        call = json.dumps({"name": "calculator", "arguments": {"expression": f"{a} * {b}"}})
        rows.append({"id": f"product-{a}-{b}", "prompt": f"What is {a} * {b}? Reply with the number.",
                     "answer": str(a * b), "target": f"<tool_call>{call}</tool_call>"})
    return rows


def answer_rows(rows: list[dict]) -> list[dict]:
    """The second turn of each row: the question, the call and the calculator's result as the prompt (TRL's
    conversational rows), the product as the target. A warm-up on the first turn alone teaches the model to call
    and nothing else: it then calls again after every result until the turn limit (seed 0 did, every trajectory)."""
    out = []
    for r in rows:
        expression = json.loads(r["target"][len("<tool_call>"):-len("</tool_call>")])["arguments"]["expression"]
        out.append({"id": r["id"] + "-answer", "answer": r["answer"], "target": f"The answer is {r['answer']}.",
                    "messages": [{"role": "user", "content": r["prompt"]},
                                 {"role": "assistant", "content": r["target"]},
                                 {"role": "tool", "content": calculator(expression)}]})
    return out


if __name__ == "__main__":
    rows = make_rows()
    for name, part in (("products.jsonl", rows), ("products_answer.jsonl", answer_rows(rows))):
        out = Path(__file__).with_name(name)
        out.write_text("".join(json.dumps(r) + "\n" for r in part))
        print(f"wrote {out}")
