"""The AccessPolicy files the deploy layouts ship, read by the servers' own loader.

`parse_policy` (services/common/security/policy.py) is strict: a misspelt field, an unknown
subject kind or role, a JWT subject without its issuer or of an issuer the file does not
configure, a binding to an undeclared tenant is an error naming the field path — here, before
any server reads the file.
"""

from __future__ import annotations

from typing import Any

import pytest

from services.common.errors import InvalidArgument
from services.common.security.policy import AccessPolicy, parse_policy


def check_access_policy(policy: Any, source: str = "AccessPolicy") -> AccessPolicy:
    """The parsed policy; fails the test with the loader's message otherwise."""
    try:
        return parse_policy(policy, source=source)
    except InvalidArgument as error:
        pytest.fail(error.message)
