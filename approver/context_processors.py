from approver import roles as role_names


def roles(request):
    user = request.user
    return {
        "is_on_call": role_names.has_role(user, role_names.ON_CALL),
        "is_approver": role_names.has_role(user, role_names.APPROVER),
        "is_admin": role_names.has_role(user, role_names.ADMIN),
    }
