#!/usr/bin/env python3
"""Checks Tessera's Helm chart without a Kubernetes cluster, as `tests/chart.rs` runs it.

For each values file given (and the chart's defaults, as `-`):

1. `helm lint --strict` with Helm's own engine (helm-python-sdk carries the Helm Go SDK),
   against Kubernetes 1.32;
2. renders the chart as `helm install` would (hooks included);
3. lints the rendered YAML with yamllint;
4. validates every rendered object against Kubernetes 1.32's schemas (kubernetes-validate,
   strict: an unknown field is an error). Kinds with no schema there (the Prometheus
   operator's) are listed, not failed;
5. writes the rendered chart to OUT/<values name>.yaml for `kubectl apply --dry-run=server`.

`--invalid FILE` does the opposite: the values must be refused, and the refusal is printed.

Prints one JSON object: {"<values name>": {"objects": N, "kinds": {...},
"no_schema": [...], "file": "..."}, "invalid": {"<file>": "<Helm's message>"}} and exits
non-zero on the first problem, saying what it was.
"""

import argparse
import json
import pathlib
import sys

import helm_python
import kubernetes_validate
import yaml
from yamllint import config as yamllint_config
from yamllint import linter

KUBE_VERSION = "1.32"
RELEASE = "tessera"
NAMESPACE = "tessera"

# The rendered chart holds generated JSON (the dashboard) and PEM-free long flag lines:
# line length is not a property of a manifest.
YAMLLINT = yamllint_config.YamlLintConfig(
    "extends: default\n"
    "rules:\n"
    "  line-length: disable\n"
    "  document-start: disable\n"
    "  comments: {min-spaces-from-content: 1}\n"
    "  braces: {max-spaces-inside: 1}\n"
    "  brackets: {max-spaces-inside: 1}\n"
    "  indentation: {spaces: 2, indent-sequences: whatever}\n"
)


def fail(what):
    print(what, file=sys.stderr)
    sys.exit(1)


def load_values(path):
    if path == "-":
        return {}
    with open(path) as f:
        return yaml.safe_load(f) or {}


def lint(chart, values, name):
    report = helm_python.lint(chart, values, strict=True, namespace=NAMESPACE, kube_version="v1.32.0")
    problems = [m for m in report.get("messages", []) if m.get("severity", 0) >= 2]
    if report.get("errors") or problems:
        fail(f"{name}: helm lint --strict: {json.dumps(report, indent=2)}")


def render(chart, values):
    return helm_python.Chart.load(chart).render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)


def check(chart, values_file, out):
    name = "default" if values_file == "-" else pathlib.Path(values_file).stem
    values = load_values(values_file)
    lint(chart, values, name)
    rendered = render(chart, values)
    docs = []
    text = []
    for template in sorted(rendered):
        manifest = rendered[template]
        if template.endswith("NOTES.txt") or not manifest.strip():
            continue
        # (A template that renders only its later parts starts with a blank line.)
        manifest = manifest.lstrip("\n")
        for problem in linter.run(manifest, YAMLLINT):
            if problem.level == "error":
                fail(f"{name}: {template}:{problem.line}:{problem.column}: yamllint: {problem.desc} ({problem.rule})")
        for doc in yaml.safe_load_all(manifest):
            if doc:
                docs.append((template, doc))
        text.append(f"# Source: {template}\n{manifest.strip()}\n")
    kinds = {}
    no_schema = set()
    seen = set()
    for template, doc in docs:
        kind = doc.get("kind")
        key = (doc.get("apiVersion"), kind, doc.get("metadata", {}).get("name"))
        if key in seen:
            fail(f"{name}: {template}: {key} is rendered twice")
        seen.add(key)
        kinds[kind] = kinds.get(kind, 0) + 1
        try:
            kubernetes_validate.validate(doc, KUBE_VERSION, strict=True)
        except kubernetes_validate.SchemaNotFoundError:
            no_schema.add(f"{doc.get('apiVersion')}/{kind}")
        except kubernetes_validate.ValidationError as e:
            path = "/".join(str(p) for p in e.path)
            fail(f"{name}: {template}: {kind} {key[2]}: {path}: {e.message}")
    target = pathlib.Path(out) / f"{name}.yaml"
    target.write_text("---\n".join(text))
    return name, {"objects": len(docs), "kinds": kinds, "no_schema": sorted(no_schema), "file": str(target)}


def refused(chart, values_file):
    values = load_values(values_file)
    try:
        render(chart, values)
    except helm_python.HelmError as e:
        return str(e)
    fail(f"{values_file}: these values were rendered, but must be refused")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("chart")
    p.add_argument("--out", required=True)
    p.add_argument("--values", action="append", default=[], help="a values file, or - for the defaults")
    p.add_argument("--invalid", action="append", default=[], help="values the chart must refuse")
    args = p.parse_args()
    helm_python.disable_logging()
    report = {"invalid": {}}
    for v in args.values:
        name, result = check(args.chart, v, args.out)
        report[name] = result
    for v in args.invalid:
        report["invalid"][v] = refused(args.chart, v)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
