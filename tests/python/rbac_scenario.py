"""RBAC through the official Python client (`kubernetes` on PyPI), as an operator's tooling
would drive it: roles and bindings, a user limited by them, a ServiceAccount token from the
TokenRequest API, and the rules review. Run by tests/rbac.rs against `tessera up`:

    python rbac_scenario.py KUBECONFIG NAMESPACE USER_TOKEN

Prints one line per step and exits non-zero at the first step that goes wrong.
"""
import json
import sys

from kubernetes import client, config
from kubernetes.client.rest import ApiException
from scenario import as_bearer, refused

kubeconfig, ns, user_token = sys.argv[1:4]
admin = config.new_client_from_config(config_file=kubeconfig)


rbac = client.RbacAuthorizationV1Api(admin)
core = client.CoreV1Api(admin)

names = [r.metadata.name for r in rbac.list_cluster_role().items]
assert {"admin", "edit", "view", "cluster-admin"} <= set(names), names
print("default cluster roles listed")

rbac.create_namespaced_role(ns, client.V1Role(
    metadata=client.V1ObjectMeta(name="cm-reader"),
    rules=[client.V1PolicyRule(api_groups=[""], resources=["configmaps"],
                               verbs=["get", "list"])]))
rbac.create_namespaced_role_binding(ns, client.V1RoleBinding(
    metadata=client.V1ObjectMeta(name="carol-reads"),
    role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role",
                              name="cm-reader"),
    subjects=[client.RbacV1Subject(api_group="rbac.authorization.k8s.io", kind="User",
                                   name="carol")]))
print("role and binding created")

carol = client.CoreV1Api(as_bearer(admin, user_token))
carol.list_namespaced_config_map(ns)
e = refused(lambda: carol.create_namespaced_config_map(
    ns, client.V1ConfigMap(metadata=client.V1ObjectMeta(name="x"))))
assert 'User "carol" cannot create resource "configmaps"' in json.loads(e.body)["message"], e.body
print("carol reads configmaps and may not create them")

review = client.AuthorizationV1Api(as_bearer(admin, user_token)).create_self_subject_rules_review(
    client.V1SelfSubjectRulesReview(spec=client.V1SelfSubjectRulesReviewSpec(namespace=ns)))
granted = [r for r in review.status.resource_rules if "configmaps" in (r.resources or [])]
assert granted and sorted(granted[0].verbs) == ["get", "list"], review.status
print("the rules review shows the role")

core.create_namespaced_service_account(ns, client.V1ServiceAccount(
    metadata=client.V1ObjectMeta(name="bot")))
token = core.create_namespaced_service_account_token("bot", ns, client.AuthenticationV1TokenRequest(
    spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=600))).status.token
bot = client.CoreV1Api(as_bearer(admin, token))
refused(lambda: bot.list_namespaced_config_map(ns))
rbac.create_namespaced_role_binding(ns, client.V1RoleBinding(
    metadata=client.V1ObjectMeta(name="bot-reads"),
    role_ref=client.V1RoleRef(api_group="rbac.authorization.k8s.io", kind="Role",
                              name="cm-reader"),
    subjects=[client.RbacV1Subject(kind="ServiceAccount", name="bot", namespace=ns)]))
bot.list_namespaced_config_map(ns)
print("the ServiceAccount token works once bound")
print("ok")
