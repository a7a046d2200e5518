"""Roles are Django groups. These names are the contract between the demo, the views and the admins."""

ON_CALL = "on-call"
APPROVER = "approver"
ADMIN = "admin"

ALL = (ON_CALL, APPROVER, ADMIN)


def has_role(user, role: str) -> bool:
    if not user.is_authenticated or not user.is_active:
        return False
    # Cached per request object: the run list and base layout ask several times.
    names = getattr(user, "_role_names", None)
    if names is None:
        names = set(user.groups.values_list("name", flat=True))
        user._role_names = names
    return role in names


def has_any_role(user, *roles: str) -> bool:
    return any(has_role(user, role) for role in roles)
