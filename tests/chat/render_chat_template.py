#!/usr/bin/env python3
"""Oracle for tests/chat/k2_format_test.cc: renders message lists with the `chat_template` of a
tokenizer_config.json exactly the way Hugging Face transformers does (a jinja2
ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks, the loopcontrols extension, and
transformers' own `tojson` filter: json.dumps with ensure_ascii=False, default separators, keys in
insertion order), so the C++ renderer can be compared byte for byte.

Usage: render_chat_template.py TOKENIZER_CONFIG CASES_JSON OUT_JSON
  CASES_JSON: a list of {"messages": [...OpenAI-style messages...],
                         "tools_json": "" or the JSON text of the tools array,
                         "add_generation_prompt": bool}
  OUT_JSON:   the list of rendered strings, in case order.
Exit status: 0 ok, 3 when jinja2 cannot be imported, 1 on any other failure.
"""
import json
import sys


def main() -> int:
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 1
    try:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment
    except ImportError as e:
        print(f"render_chat_template.py: jinja2 is not importable ({e}); "
              "install it (Debian: apt-get install python3-jinja2)", file=sys.stderr)
        return 3

    config_path, cases_path, out_path = sys.argv[1:]
    with open(config_path, encoding="utf-8") as f:
        config = json.load(f)
    with open(cases_path, encoding="utf-8") as f:
        cases = json.load(f)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # transformers overrides jinja's tojson: no HTML escaping, unicode kept as is.
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    template = env.from_string(config["chat_template"])

    special = {k: config.get(k) for k in ("bos_token", "eos_token", "unk_token", "pad_token")}
    rendered = []
    for case in cases:
        tools = json.loads(case["tools_json"]) if case.get("tools_json") else None
        rendered.append(template.render(messages=case["messages"], tools=tools, documents=None,
                                        add_generation_prompt=case["add_generation_prompt"],
                                        **special))
    with open(out_path, "w", encoding="utf-8") as f:
        json.dump(rendered, f, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
