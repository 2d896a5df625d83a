#!/usr/bin/env python3
"""Reference K3 (XTML) chat encoder for tests: the oracle the C++ renderer is compared with.

Written for klinear from the rules of Moonshot's `encoding_k3.py` (repository main) as issue 11 and
docs/DESIGN.md "Chat formats" state them, NOT from klinear's code: a conversation becomes a list of
segments (text, allow_special); every segment is encoded by `tiktoken` on its own (markers with specials
allowed, every other piece as plain text), over the `tiktoken.model` and the special table of
`tokenizer_config.json` in TOKENIZER_DIR, cut into pieces exactly as `tokenization_kimi.py` does.

Usage:
  k3_reference_encoder.py TOKENIZER_DIR CASES_JSON OUT_JSON
      CASES_JSON: a list of cases (below); OUT_JSON: per case {"ids": [...], "text": "..."} or
      {"error": "..."} when the reference rejects the case.
  k3_reference_encoder.py --fill TOKENIZER_DIR TABLE_JSON
      Rewrites TABLE_JSON ({"cases": [{"name": ..., case fields..., "ids": [...]}]}) with every
      case's "ids" recomputed here. This is how the committed expected-id table is made.
A case: {"messages": [OpenAI messages], "tools": [...] or null, "thinking": bool (default true),
         "thinking_effort": "low"|"high"|"max"|null (default null), "tool_choice": str or null,
         "response_format": object, string or null, "add_generation_prompt": bool (default true)}.
Exit status: 0 ok, 3 when tiktoken cannot be imported, 1 on any other failure.
"""
import json
import os
import sys

OPEN, CLOSE, SEP, END = "<|open|>", "<|close|>", "<|sep|>", "<|end_of_msg|>"
EFFORTS = ("low", "high", "max")

# ---- segments ---------------------------------------------------------------------------------


class Segments:
    """Collects (text, allow_special) pairs; empty text is never a segment."""

    def __init__(self):
        self.items = []

    def marker(self, name):
        self.items.append((name, True))

    def text(self, value):
        value = str(value)
        if value:
            self.items.append((value, False))

    def open(self, tag, attrs=()):
        self.marker(OPEN)
        self.text(tag)
        for key, value in attrs:
            escaped = str(value).replace("&", "&amp;").replace('"', "&quot;")
            for piece in (" " + key, '="', escaped, '"'):
                self.text(piece)
        self.marker(SEP)

    def close(self, tag):
        self.marker(CLOSE)
        self.text(tag)
        self.marker(SEP)

    def content(self, content):
        if content is None:
            return
        if isinstance(content, str):
            self.text(content)
            return
        for part in content:
            if part.get("type", "text") != "text":
                raise ValueError("only text parts are supported")
            self.text(part["text"])

    def system(self, kind, body):
        self.open("message", [("role", "system"), ("type", kind)])
        self.text(body.strip())
        self.close("message")
        self.marker(END)


def sorted_deep(value):
    if isinstance(value, dict):
        return {k: sorted_deep(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [sorted_deep(v) for v in value]
    return value


def compact(value):
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def declare_tools(out, tools, dynamic):
    if dynamic:
        head = ("## New Tools Available\nThe system dynamically extends the toolset via lazy-loading.\n"
                "You have access to all existing and extended tools.\nHere are the specs for the extended tools.\n\n")
    else:
        head = "# Tools\nHere are the available tools, described in JSONSchema.\n\n"
    out.system("tool-declare", head + "```json\n" + compact(sorted_deep(tools)) + "\n```")


def call_function(call):
    return call.get("function", call)


def arguments_of(function):
    """(dict of arguments, raw text for a json element or None)."""
    args = function.get("arguments")
    if args is None:
        return {}, None
    if isinstance(args, dict):
        return args, None
    if not args.strip():
        return {}, None
    try:
        parsed = json.loads(args)
    except json.JSONDecodeError:
        return {}, args
    if not isinstance(parsed, dict):
        raise ValueError("tool call arguments must be a JSON object")
    return parsed, None


def type_name(value):
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict):
        return "object"
    return "array"


def reorder_tool_results(messages):
    """Each run of consecutive tool messages, when every one answers (by tool_call_id) a call of
    the latest assistant message, is sorted by the position of that call (stably) and named after
    it; a run with any unmatched message is kept as it is."""
    out, calls_by_id, i = [], {}, 0
    while i < len(messages):
        m = messages[i]
        if m.get("role") != "tool":
            if m.get("role") == "assistant":
                calls_by_id = {}
                for pos, call in enumerate(m.get("tool_calls") or [], start=1):
                    if call.get("id") is not None:
                        calls_by_id.setdefault(str(call["id"]), (pos, call_function(call).get("name")))
            out.append(m)
            i += 1
            continue
        run = []
        while i < len(messages) and messages[i].get("role") == "tool":
            run.append(messages[i])
            i += 1
        keys = []
        for m in run:
            cid = m.get("tool_call_id", m.get("id"))
            keys.append(calls_by_id.get(str(cid)) if cid is not None else None)
        if any(k is None for k in keys):
            out.extend(run)
            continue
        order = sorted(range(len(run)), key=lambda j: (keys[j][0], j))
        for j in order:
            m, name = dict(run[j]), keys[j][1]
            if name is not None:
                m["tool"] = name
                if "name" in m:
                    m["name"] = name
            out.append(m)
    return out


def build_segments(case):
    messages = reorder_tool_results(case.get("messages") or [])
    thinking = case.get("thinking", True)
    out = Segments()
    if case.get("tools"):
        declare_tools(out, case["tools"], dynamic=False)
    effort = case.get("thinking_effort")
    if thinking and effort is not None:
        if effort not in EFFORTS:
            raise ValueError("unsupported thinking_effort %r" % (effort,))
        out.system("thinking-effort",
                   "`thinking_effort` guides on how much to think in your thinking channel (not including the "
                   "response channel), supported values include `low`, `medium`, `high`, and `max`.\n"
                   "Now the system is invoked with `thinking_effort=%s`." % effort)
    last_calls, tool_index = None, 0
    for m in messages:
        role = m["role"]
        if role == "system" and m.get("tools"):
            declare_tools(out, m["tools"], dynamic=True)
        elif role in ("system", "user"):
            attrs = [("role", role)] + ([("name", m["name"])] if m.get("name") else [])
            out.open("message", attrs)
            out.content(m.get("content"))
            out.close("message")
            out.marker(END)
        elif role == "assistant":
            last_calls, tool_index = m.get("tool_calls"), 0
            attrs = [("role", "assistant")] + ([("name", m["name"])] if m.get("name") else [])
            out.open("message", attrs)
            if thinking:
                out.open("think")
                reasoning = m.get("reasoning_content") or m.get("reasoning")
                if reasoning is not None and str(reasoning).strip():
                    out.text(reasoning)
                out.close("think")
            out.open("response")
            out.content(m.get("content"))
            out.close("response")
            if last_calls:
                out.open("tools")
                for index, call in enumerate(last_calls, start=1):
                    fn = call_function(call)
                    args, raw = arguments_of(fn)
                    out.open("call", [("tool", fn["name"]), ("index", index)])
                    if raw is not None:
                        out.open("json", [("type", "object")])
                        out.text(raw)
                        out.close("json")
                    else:
                        for key, value in args.items():
                            out.open("argument", [("key", key), ("type", type_name(value))])
                            out.text(value if isinstance(value, str) else json.dumps(value, ensure_ascii=False))
                            out.close("argument")
                    out.close("call")
                out.close("tools")
            out.close("message")
            out.marker(END)
        elif role == "tool":
            tool_index += 1
            name = m.get("tool", m.get("name"))
            if name is None and last_calls and tool_index <= len(last_calls):
                name = call_function(last_calls[tool_index - 1])["name"]
            if name is None:
                raise ValueError("tool message without a resolvable tool name")
            out.open("message", [("role", "tool"), ("tool", name), ("index", tool_index)])
            out.content(m.get("content"))
            out.close("message")
            out.marker(END)
        else:
            raise ValueError("unknown role %r" % (role,))
    choice = case.get("tool_choice")
    if choice in ("required", "none"):
        must = "call tools" if choice == "required" else "NOT call any tools"
        out.system("tool-choice",
                   "The system is invoked with `tool_choice=%s`.\nYou MUST %s in the next message." % (choice, must))
    fmt = case.get("response_format")
    kind = fmt.get("type", fmt) if isinstance(fmt, dict) else fmt
    raw_json = "Your response must be raw JSON data without markdown code blocks (```json) or any additional formatting."
    if kind == "json_object":
        out.system("response-format", "The system is invoked with `response_format=json_object`.\n" + raw_json)
    elif kind == "json_schema":
        holder = fmt.get("json_schema") if isinstance(fmt, dict) else None
        schema = None
        if isinstance(holder, dict):
            schema = holder.get("schema", holder.get("json_schema", holder))
        elif holder is not None:
            schema = holder
        out.system("response-format",
                   "The system is invoked with `response_format=json_schema`.\n" + raw_json +
                   "\nThe JSON data must match the following schema:\n```json\n" + compact(sorted_deep(schema)) +
                   "\n```")
    if case.get("add_generation_prompt", True):
        out.open("message", [("role", "assistant")])
        out.open("think" if thinking else "response")
    return out.items


# ---- tokens -----------------------------------------------------------------------------------

PATTERN = "|".join([
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
])


def load_encoding(tokenizer_dir):
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    ranks = load_tiktoken_bpe(os.path.join(tokenizer_dir, "tiktoken.model"))
    with open(os.path.join(tokenizer_dir, "tokenizer_config.json"), encoding="utf-8") as f:
        named = {int(k): v["content"] for k, v in json.load(f).get("added_tokens_decoder", {}).items()}
    base = len(ranks)
    specials = {named.get(i, "<|reserved_token_%d|>" % i): i for i in range(base, base + 256)}
    return tiktoken.Encoding(name="kimi", pat_str=PATTERN, mergeable_ranks=ranks, special_tokens=specials)


def pieces(text):
    """tokenization_kimi.py's cuts: 400,000-character windows, then no run of isspace or
    non-isspace characters longer than 25,000."""
    for start in range(0, len(text), 400_000):
        window = text[start:start + 400_000]
        run, space, cut = 0, window[:1].isspace(), 0
        for i, ch in enumerate(window):
            if ch.isspace() != space:
                space, run = ch.isspace(), 1
            else:
                run += 1
                if run > 25_000:
                    yield window[cut:i]
                    cut, run = i, 1
        yield window[cut:]


def encode_segments(enc, segments):
    ids = []
    for text, special in segments:
        for piece in pieces(text):
            if special:
                ids += enc.encode(piece, allowed_special="all")
            else:
                ids += enc.encode(piece, disallowed_special=())
    return ids


def run_case(enc, case):
    try:
        segments = build_segments(case)
    except (ValueError, KeyError, TypeError) as e:
        return {"error": "%s: %s" % (type(e).__name__, e)}
    return {"ids": encode_segments(enc, segments), "text": "".join(t for t, _ in segments)}


def main():
    args = sys.argv[1:]
    fill = bool(args) and args[0] == "--fill"
    if fill:
        args = args[1:]
    if len(args) != (2 if fill else 3):
        print(__doc__, file=sys.stderr)
        return 1
    try:
        enc = load_encoding(args[0])
    except ImportError as e:
        print("k3_reference_encoder.py: tiktoken is not importable (%s); install it: "
              "pip install tiktoken (scripts/setup.sh does)" % e, file=sys.stderr)
        return 3
    with open(args[1], encoding="utf-8") as f:
        doc = json.load(f)
    if fill:
        for case in doc["cases"]:
            result = run_case(enc, case)
            if "error" in result:
                print("case %s: %s" % (case["name"], result["error"]), file=sys.stderr)
                return 1
            case["ids"] = result["ids"]
        with open(args[1], "w", encoding="utf-8") as f:
            f.write('{"cases": [\n')
            f.write(",\n".join(json.dumps(c, ensure_ascii=False) for c in doc["cases"]))
            f.write("\n]}\n")
        return 0
    with open(args[2], "w", encoding="utf-8") as f:
        json.dump([run_case(enc, case) for case in doc], f, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
