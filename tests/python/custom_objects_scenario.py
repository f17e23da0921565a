"""Custom resources through the official Python client (`kubernetes` on PyPI), as an
operator would drive them: a CRD created with ApiextensionsV1Api, then its objects with
CustomObjectsApi — create, get, list, merge patch, the status and scale subresources, a
watch, invalid objects refused naming the field — and RBAC limiting a user to reading them.
Run by tests/crd.rs against `tessera up`:

    python custom_objects_scenario.py KUBECONFIG NAMESPACE USER_TOKEN USER_NAME

Prints one line per step and exits non-zero at the first step that goes wrong.
"""
import json
import sys
import time

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException
from scenario import as_bearer, refused

kubeconfig, ns, user_token, user_name = sys.argv[1:5]
admin = config.new_client_from_config(config_file=kubeconfig)
GROUP, VERSION, PLURAL = "stable.example.com", "v1", "crontabs"


def body_of(e):
    return json.loads(e.body)


ext = client.ApiextensionsV1Api(admin)
crd = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": f"{PLURAL}.{GROUP}"},
    "spec": {
        "group": GROUP,
        "scope": "Namespaced",
        "names": {"plural": PLURAL, "singular": "crontab", "kind": "CronTab", "shortNames": ["ct"]},
        "versions": [{
            "name": VERSION, "served": True, "storage": True,
            "subresources": {"status": {}, "scale": {
                "specReplicasPath": ".spec.replicas", "statusReplicasPath": ".status.replicas"}},
            "schema": {"openAPIV3Schema": {"type": "object", "properties": {
                "spec": {"type": "object", "required": ["cronSpec"], "properties": {
                    "cronSpec": {"type": "string", "pattern": "^(\\S+ ){4}\\S+$"},
                    "image": {"type": "string", "default": "busybox"},
                    "replicas": {"type": "integer", "minimum": 0, "default": 1}}},
                "status": {"type": "object", "properties": {
                    "replicas": {"type": "integer"}, "lastRun": {"type": "string"}}}}}},
        }],
    },
}
ext.create_custom_resource_definition(crd)
for _ in range(100):
    got = ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
    conds = {c.type: c.status for c in (got.status.conditions or [])}
    if conds.get("Established") == "True":
        break
    time.sleep(0.1)
else:
    raise AssertionError("the CRD was never Established")
print("crd established")

api = client.CustomObjectsApi(admin)
obj = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "CronTab",
       "metadata": {"name": "nightly"}, "spec": {"cronSpec": "0 3 * * *"}}
created = api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, obj)
assert created["spec"]["image"] == "busybox", created
assert created["spec"]["replicas"] == 1, created
print("created with defaults")

bad = dict(obj, metadata={"name": "bad"}, spec={"cronSpec": "every night"})
status = body_of(refused(lambda: api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, bad), 422))
assert status["reason"] == "Invalid", status
assert any(c["field"] == "spec.cronSpec" for c in status["details"]["causes"]), status
refused(lambda: api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "bad"), 404)
print("invalid refused")

patched = api.patch_namespaced_custom_object(
    GROUP, VERSION, ns, PLURAL, "nightly", {"spec": {"image": "alpine"}})
assert patched["spec"]["image"] == "alpine", patched
api.patch_namespaced_custom_object_status(
    GROUP, VERSION, ns, PLURAL, "nightly", {"status": {"lastRun": "never"}})
got = api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "nightly")
assert got["status"]["lastRun"] == "never", got
print("patched spec and status")

api.patch_namespaced_custom_object_scale(
    GROUP, VERSION, ns, PLURAL, "nightly", {"spec": {"replicas": 4}})
scale = api.get_namespaced_custom_object_scale(GROUP, VERSION, ns, PLURAL, "nightly")
assert scale["spec"]["replicas"] == 4, scale
got = api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "nightly")
assert got["spec"]["replicas"] == 4, got
print("scaled")

listed = api.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
assert [i["metadata"]["name"] for i in listed["items"]] == ["nightly"], listed
everywhere = api.list_cluster_custom_object(GROUP, VERSION, PLURAL)
assert len(everywhere["items"]) == 1, everywhere
api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, dict(obj, metadata={"name": "hourly"}))
w = watch.Watch()
seen = []
for ev in w.stream(api.list_namespaced_custom_object, GROUP, VERSION, ns, PLURAL,
                   resource_version=listed["metadata"]["resourceVersion"], timeout_seconds=10):
    seen.append((ev["type"], ev["object"]["metadata"]["name"]))
    if ("ADDED", "hourly") in seen:
        w.stop()
        break
assert ("ADDED", "hourly") in seen, seen
print("listed and watched")

# RBAC: a user bound to a Role that reads crontabs reads them and nothing more.
rbac = client.RbacAuthorizationV1Api(admin)
rbac.create_namespaced_role(ns, {"metadata": {"name": "crontab-reader"}, "rules": [
    {"apiGroups": [GROUP], "resources": [PLURAL], "verbs": ["get", "list"]}]})
rbac.create_namespaced_role_binding(ns, {
    "metadata": {"name": "crontab-reader"},
    "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "crontab-reader"},
    "subjects": [{"kind": "User", "name": user_name}]})
user = client.CustomObjectsApi(as_bearer(admin, user_token))
for _ in range(100):
    try:
        mine = user.list_namespaced_custom_object(GROUP, VERSION, ns, PLURAL)
        break
    except ApiException as e:
        assert e.status == 403, (e.status, e.body)
        time.sleep(0.1)
else:
    raise AssertionError("the binding never took effect")
assert len(mine["items"]) == 2, mine
status = body_of(refused(lambda: user.create_namespaced_custom_object(
    GROUP, VERSION, ns, PLURAL, dict(obj, metadata={"name": "mine"})), 403))
assert f"cannot create resource \"{PLURAL}\" in API group \"{GROUP}\"" in status["message"], status
refused(lambda: user.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "nightly"), 403)
print("rbac limits a user to reading")

api.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "nightly")
refused(lambda: api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, "nightly"), 404)
ext.delete_custom_resource_definition(f"{PLURAL}.{GROUP}")
for _ in range(100):
    try:
        ext.read_custom_resource_definition(f"{PLURAL}.{GROUP}")
        time.sleep(0.1)
    except ApiException as e:
        assert e.status == 404, (e.status, e.body)
        break
else:
    raise AssertionError("the CRD was never deleted")
print("deleted")
print("ok")
