"""The core names no model family: its headers (the request, result, packet, stage info, the
family and kind registry, the serving runtime) hold none of the families' names, kind names or
fields. The names come from the families' own registrations (worker/<family>/family.cc), so a
family that is added is checked without a change here.

usage: core_names_test.py <source root>
"""

import pathlib
import re
import sys

# Fields a family keeps in its own parts; the core says voice, codes and audio instead.
FAMILY_FIELDS = ["speaker", "num_code_groups", "code_predictor", "OmniOptions", "OmniSampling",
                 "DiffusionRequest", "diffusers"]


def family_names(root):
    names = set()
    for family in sorted(root.glob("worker/*/family.cc")):
        text = family.read_text()
        folder = family.parent.name  # qwen3_omni, wan
        names.add(folder)
        names.add(re.match(r"[a-z]*", folder).group(0))  # its first word: "qwen"
        names.update(re.findall(r'name\(\) const override \{ return "([^"]+)"; \}', text))
        names.update(re.findall(r'\bk\.name = "([^"]+)";', text))
    names.discard("")
    return names


def main():
    root = pathlib.Path(sys.argv[1])
    names = family_names(root)
    for expected in ("qwen3_omni", "wan", "thinker", "talker", "code2wav", "diffusion"):
        if expected not in names:
            sys.exit(f"FAIL: the families' registrations no longer name '{expected}': "
                     f"the test reads {sorted(names)}")
    headers = (sorted(root.glob("worker/pipeline/*.h")) + sorted(root.glob("worker/runtime/*.h"))
               + [root / "model_runner/include/model_runner/runner/conversation.h"])
    if len(headers) < 10:
        sys.exit(f"FAIL: only {len(headers)} core headers found under {root}")
    words = sorted(names | set(FAMILY_FIELDS))
    pattern = re.compile(r"(?<![A-Za-z])(" + "|".join(map(re.escape, words)) + r")(?![A-Za-z])",
                         re.IGNORECASE)
    hits = []
    for header in headers:
        for number, line in enumerate(header.read_text().splitlines(), 1):
            for match in pattern.finditer(line):
                hits.append(f"{header.relative_to(root)}:{number}: '{match.group(1)}': {line.strip()}")
    if hits:
        sys.exit("FAIL: the core names a family:\n" + "\n".join(hits))
    print(f"ok: {len(headers)} core headers name none of {len(words)} family names and fields")


if __name__ == "__main__":
    main()
