"""What the Python scenarios share: a client of the same server as another bearer, and a
call that must be refused with a given status."""
from kubernetes import client
from kubernetes.client.rest import ApiException


def as_bearer(admin, token):
    """An ApiClient of `admin`'s server that authenticates with `token`."""
    c = client.Configuration()
    c.host = admin.configuration.host
    c.ssl_ca_cert = admin.configuration.ssl_ca_cert
    c.api_key = {"authorization": "Bearer " + token}
    return client.ApiClient(c)


def refused(call, status=403):
    """Runs `call`, which must fail with `status`; returns the ApiException."""
    try:
        call()
    except ApiException as e:
        assert e.status == status, (e.status, e.body)
        return e
    raise AssertionError("the call was not refused")
