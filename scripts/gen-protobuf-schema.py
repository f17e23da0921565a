#!/usr/bin/env python3
"""Generates cluster/apiserver/src/protobuf_schema.rs: the field numbers and wire types of the
Kubernetes protobuf messages that kubectl's typed commands send, so that the API server can
decode them into JSON.

The numbers are those of Kubernetes' generated.proto files; this script reads them from the
sources of the k8s-pb crate (prost code generated from those files), whose directory is the
only argument:

    scripts/gen-protobuf-schema.py PATH/TO/k8s-pb-0.9.0 > cluster/apiserver/src/protobuf_schema.rs
"""
import os
import re
import sys

ROOTS = [
    "api.core.v1.Namespace", "api.core.v1.ConfigMap", "api.core.v1.Secret",
    "api.core.v1.ServiceAccount", "api.core.v1.Service", "api.core.v1.ResourceQuota",
    "api.core.v1.Pod", "api.core.v1.Binding", "api.apps.v1.Deployment", "api.batch.v1.Job",
    "api.batch.v1.CronJob", "api.scheduling.v1.PriorityClass",
    "api.policy.v1.PodDisruptionBudget", "api.authorization.v1.SelfSubjectAccessReview",
    "apimachinery.pkg.apis.meta.v1.DeleteOptions", "api.policy.v1.Eviction",
    "api.rbac.v1.Role", "api.rbac.v1.RoleBinding", "api.rbac.v1.ClusterRole",
    "api.rbac.v1.ClusterRoleBinding", "api.authorization.v1.SelfSubjectRulesReview",
    "api.authentication.v1.TokenRequest", "api.authentication.v1.SelfSubjectReview",
    "api.core.v1.PersistentVolumeClaim", "api.core.v1.PersistentVolume",
    "api.core.v1.PodTemplate", "api.networking.v1.Ingress", "api.networking.v1.IngressClass",
    "api.networking.v1.NetworkPolicy", "api.storage.v1.StorageClass",
    "api.autoscaling.v1.HorizontalPodAutoscaler", "api.autoscaling.v2.HorizontalPodAutoscaler",
    "api.core.v1.ReplicationController", "api.certificates.v1.CertificateSigningRequest",
]

ATTR = re.compile(r'#\[prost\((.*)\)\]')
FIELD = re.compile(r'pub (r#)?([a-z0-9_]+):\s*(.+),\s*$')
STRUCT = re.compile(r'^pub struct (\w+) \{')


def module_of(root, path):
    rel = os.path.relpath(os.path.dirname(path), os.path.join(root, "src"))
    return rel.replace(os.sep, ".")


def resolve(module, ty):
    """The full name of a message type referenced from `module`."""
    ty = ty.replace(" ", "").replace(",>", ">").strip().rstrip(",")
    for wrapper in ("::core::option::Option<", "::prost::alloc::vec::Vec<",
                    "::prost::alloc::boxed::Box<"):
        while ty.startswith(wrapper):
            ty = ty[len(wrapper):-1].strip()
    parts = ty.split("::")
    mod = module.split(".")
    while parts and parts[0] == "super":
        parts.pop(0)
        mod.pop()
    if parts and parts[0] == "crate":
        parts.pop(0)
        mod = []
    return ".".join(mod + parts)


def parse(root):
    messages = {}
    for dirpath, _, files in os.walk(os.path.join(root, "src")):
        for f in files:
            if f != "mod.rs":
                continue
            path = os.path.join(dirpath, f)
            module = module_of(root, path)
            current, attr, held = None, None, ""
            for line in open(path, encoding="utf-8"):
                line = line.strip()
                # A field whose type continues on the next lines.
                if held or (attr and line.startswith("pub ")):
                    held = held + " " + line if held else line
                    if not held.endswith(",") or held.count("<") != held.count(">"):
                        continue
                    line, held = held, ""
                m = STRUCT.match(line)
                if m:
                    current = module + "." + m.group(1)
                    messages[current] = []
                    continue
                if line == "}":
                    current = None
                    continue
                if current is None:
                    continue
                m = ATTR.match(line)
                if m:
                    attr = m.group(1)
                    continue
                m = FIELD.match(line)
                if m and attr:
                    name, ty = m.group(2), m.group(3)
                    tag = int(re.search(r'tag\s*=\s*"(\d+)"', attr).group(1))
                    repeated = "repeated" in attr
                    mp = re.search(r'btree_map\s*=\s*"string,\s*(\w+)"', attr)
                    if mp:
                        kind = "map_" + mp.group(1)
                        target = None
                        if mp.group(1) == "message":
                            inner = ty.replace(" ", "").replace(",>", ">")
                            inner = inner.split(",", 1)[1].rsplit(">", 1)[0]
                            target = resolve(module, inner)
                    else:
                        kind = attr.split(",")[0].strip().split(" ")[0]
                        target = resolve(module, ty) if kind == "message" else None
                    messages[current].append((tag, name, kind, repeated, target))
                    attr = None
    return messages


def reachable(messages, roots):
    """The messages `roots` reach through their message-typed fields, roots included."""
    needed, todo = [], list(roots)
    while todo:
        m = todo.pop()
        if m in needed:
            continue
        if m not in messages:
            sys.exit(f"unknown message {m}")
        needed.append(m)
        for (_, _, _, _, target) in messages[m]:
            if target and target not in needed:
                todo.append(target)
    return needed


def main():
    messages = parse(sys.argv[1])
    needed = reachable(messages, ROOTS)
    kinds = {"string": "Str", "int32": "I32", "int64": "I64", "bool": "Bool", "bytes": "Bytes",
             "double": "F64", "float": "F64", "message": "Msg", "map_string": "MapStr",
             "map_bytes": "MapBytes", "map_message": "MapMsg"}
    print("//! Field numbers and wire types of the Kubernetes protobuf messages kubectl's typed")
    print("//! commands send (from Kubernetes' generated.proto files). Generated by")
    print("//! `scripts/gen-protobuf-schema.py`; do not edit.")
    print()
    print("use crate::protobuf::{Field, Kind::*};")
    print()
    print("/// Every message, by its full name (`api.core.v1.Pod`), with its fields.")
    print("pub static MESSAGES: &[(&str, &[Field])] = &[")
    for m in sorted(needed):
        print(f'    ("{m}", &[')
        for (tag, name, kind, repeated, target) in sorted(messages[m]):
            k = kinds[kind]
            tgt = f'"{target}"' if target else '""'
            print(f'        Field {{ tag: {tag}, name: "{name}", kind: {k}, repeated: {str(repeated).lower()}, message: {tgt} }},')
        print("    ]),")
    print("];")


if __name__ == "__main__":
    main()
