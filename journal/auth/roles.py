"""Roles are Django groups. These names are the contract between the demo, the views and the admins."""

ON_CALL = "on-call"
APPROVER = "approver"
ADMIN = "admin"

ALL = (ON_CALL, APPROVER, ADMIN)

# The groups as people read them ("Only approvers may…"); a group an admin made up reads as its name does.
_WORDS = {ON_CALL: "on-call engineers", APPROVER: "approvers", ADMIN: "admins"}


def in_words(group: str) -> str:
    """Who a group's members are, in words: "approvers", or "members of the group finance-leads"."""
    return _WORDS.get(group) or f"members of the group {group}"


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
