"""How failed logins lock (django-axes' handler, AXES_HANDLER), so nobody can lock someone else out cheaply.

Axes counts failures per lockout parameter and locks when any count reaches one limit. Locking on the
account alone at that limit let anyone lock an approver out with five wrong passwords, so failures count in
three ways, each with its own limit (within LOGIN_LOCKOUT_MINUTES):
- an account from one address: LOGIN_FAILURE_LIMIT (5), the guesser is locked out, the account is not;
- an account from anywhere: LOGIN_ACCOUNT_FAILURE_LIMIT (25), slower, against guessing from many addresses;
- an address, whatever the accounts: LOGIN_ADDRESS_FAILURE_LIMIT (25), against one address trying one
  password on every account.
A login is refused while any of the three is at its limit. The address is REMOTE_ADDR (axes' default),
which uvicorn sets from X-Forwarded-For only for the proxies --forwarded-allow-ips names.
"""

from axes.handlers.database import AxesDatabaseHandler
from django.conf import settings
from django.db.models import Sum

# The order of AXES_LOCKOUT_PARAMETERS (settings), whose counts `failures` reads.
LOCKOUT_PARAMETERS = [["username", "ip_address"], "username", "ip_address"]


def weighted(counts: list[int], limits: list[int]) -> int:
    """The failures to compare with the first limit, axes' one: each count scaled to it, so the result
    reaches `limits[0]` exactly when some count reaches its own limit."""
    first = limits[0]
    return max(count * first // limit for count, limit in zip(counts, limits, strict=True))


class PerAccountAndAddress(AxesDatabaseHandler):
    def get_failures(self, request, credentials=None) -> int:
        counts = [attempts.aggregate(total=Sum("failures_since_start"))["total"] or 0
                  for attempts in self.get_user_attempts(request, credentials)]
        limits = [settings.AXES_FAILURE_LIMIT, settings.LOGIN_ACCOUNT_FAILURE_LIMIT,
                  settings.LOGIN_ADDRESS_FAILURE_LIMIT]
        return weighted(counts, limits)
