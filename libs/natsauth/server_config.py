"""The `accounts`/`authorization` part of a nats-server config, rendered from `permissions.py`.

Two renderings of the same table: with literal passwords (the local stack writes its own config,
mode 0600, in its state dir) or with `$LPX_NATS_PASSWORD_<USER>` references that nats-server fills in
from its environment (compose and the Helm chart, whose secrets come from an env file or a Secret).
`infra/nats/auth.conf` is the second rendering; a unit test keeps it equal to this code's output.
"""

from __future__ import annotations

import json

from libs.natsauth import permissions as p

ISSUER_ENV = "LPX_NATS_CALLOUT_ISSUER"


def _quoted(values: list[str]) -> str:
    # JSON strings are valid NATS config strings; quoting keeps `$JS...` from reading as a variable.
    return "[" + ", ".join(json.dumps(v) for v in values) + "]"


def _user(role: p.Role, passwords: dict[str, str] | None) -> str:
    password = json.dumps(passwords[role.user]) if passwords is not None else f"${role.env_var}"
    # An empty allow list would allow everything: a user that only answers requests is denied publishing
    # (its replies go out through allow_responses).
    publish = role.publish_allow()
    perms = [f"publish: {{ allow: {_quoted(publish)} }}" if publish else 'publish: { deny: [">"] }']
    perms.append(f"subscribe: {{ allow: {_quoted(role.subscribe_allow())} }}")
    if role.answers:
        perms.append("allow_responses: true")
    body = ", ".join(perms)
    return f"      {{ user: {json.dumps(role.user)}, password: {password}, permissions: {{ {body} }} }}"


def helm_merge() -> dict:
    """The same block as `config.merge` values of the official NATS Helm chart (infra/helm/nats-values.yaml):
    YAML, with the chart's `<< $VAR >>` for environment references (its container env reads the Secret)."""
    accounts: dict = {}
    for account in (p.ACCOUNT, p.CALLOUT_ACCOUNT, p.SYSTEM_ACCOUNT):
        users = []
        for role in (r for r in p.ROLES if r.account == account):
            publish = role.publish_allow()
            perms: dict = {
                "publish": {"allow": publish} if publish else {"deny": [">"]},
                "subscribe": {"allow": role.subscribe_allow()},
            }
            if role.answers:
                perms["allow_responses"] = True
            users.append({"user": role.user, "password": f"<< ${role.env_var} >>", "permissions": perms})
        accounts[account] = {"users": users, **({"jetstream": "enabled"} if account == p.ACCOUNT else {})}
    auth_users = [role.user for role in p.ROLES]
    return {
        "accounts": accounts,
        "system_account": p.SYSTEM_ACCOUNT,
        "authorization": {
            "auth_callout": {"issuer": f"<< ${ISSUER_ENV} >>", "account": p.CALLOUT_ACCOUNT, "auth_users": auth_users}
        },
    }


def render(passwords: dict[str, str] | None = None, issuer: str | None = None) -> str:
    """The config block. `passwords` by user (None: environment references); `issuer` is the auth
    callout's account public key (None: `$LPX_NATS_CALLOUT_ISSUER`)."""
    lines = ["# Generated from libs/natsauth/permissions.py (lpx nats config); do not edit by hand.", "accounts {"]
    for account, extra in ((p.ACCOUNT, "    jetstream: enabled\n"), (p.CALLOUT_ACCOUNT, ""), (p.SYSTEM_ACCOUNT, "")):
        users = [_user(role, passwords) for role in p.ROLES if role.account == account]
        lines.append(f"  {account} {{\n{extra}    users: [\n" + "\n".join(users) + "\n    ]\n  }")
    lines.append("}")
    lines.append(f"system_account: {p.SYSTEM_ACCOUNT}")
    auth_users = ", ".join(json.dumps(role.user) for role in p.ROLES)
    lines += [
        "# Every other connection (a tenant's) is asked about at the registry's auth callout.",
        "authorization {",
        "  auth_callout {",
        f"    issuer: {json.dumps(issuer) if issuer else '$' + ISSUER_ENV}",
        f"    account: {p.CALLOUT_ACCOUNT}",
        f"    auth_users: [{auth_users}]",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"
