"""MCP authorization for clients that take only a URL: the Recorder is an OAuth 2.1 protected resource and
this app its authorization server, both from django-oauth-toolkit (RFC 8414 and 9728 metadata, RFC 7591
registration, authorization code with PKCE S256, rotating refresh tokens, RFC 8707 audience).

What is ours: the `resource` every token is bound to is this Recorder's URL (any other is `invalid_target`),
and the consent page, where the person signing in picks (or creates) the agent the client acts as. The agent
acts for that person; `journal.services.clients` keeps the link and checks it on every call.
"""

import json
from urllib.parse import parse_qs, urlsplit

from django import forms
from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.http import JsonResponse
from django.shortcuts import get_object_or_404, redirect
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST
from oauth2_provider.exceptions import OAuthToolkitError
from oauth2_provider.forms import AllowForm
from oauth2_provider.models import get_application_model
from oauth2_provider.views import (
    AuthorizationView,
    DynamicClientRegistrationManagementView,
    DynamicClientRegistrationView,
    OAuthProtectedResourceMetadataView,
    TokenView,
)
from oauthlib.oauth2.rfc6749.errors import CustomOAuth2Error

from .. import services
from ..models import Agent, ClientAuthorization
from ..services import clients
from . import roles, throttling
from .access import visible_agent

NEW_AGENT = "__new__"


def request_recorder_url(request) -> str:
    return clients.recorder_url(request.scheme, request.get_host())


class ProtectedResourceMetadata(OAuthProtectedResourceMetadataView):
    """RFC 9728 metadata, at the well-known URL and at its `/mcp` suffixed form: the resource is always the
    Recorder (this app protects nothing else with OAuth)."""

    def get_resource(self, request):
        return request_recorder_url(request)


class OnlyAuthorizationCode:
    """Registration (RFC 7591) and its updates (RFC 7592) for what this server serves: the authorization code
    grant with refresh tokens, a handful of redirect URIs, bounded names. Anything else is refused before the
    toolkit stores it."""

    MAX_REDIRECT_URIS = 10
    MAX_URI_LENGTH = 2000
    MAX_NAME_LENGTH = 200

    def dispatch(self, request, *args, **kwargs):
        if request.method in ("POST", "PUT"):
            problem = self.problem(request.body)
            if problem:
                return JsonResponse(
                    {"error": "invalid_client_metadata", "error_description": problem}, status=400
                )
        return super().dispatch(request, *args, **kwargs)

    def problem(self, body: bytes) -> str:
        try:
            data = json.loads(body)
        except ValueError:
            return "Request body must be valid JSON."
        if not isinstance(data, dict):
            return "Request body must be a JSON object."
        grants = data.get("grant_types", ["authorization_code"])
        if not isinstance(grants, list) or not set(grants) <= {"authorization_code", "refresh_token"}:
            return "grant_types: this server issues tokens only by authorization_code (with refresh_token)."
        responses = data.get("response_types", ["code"])
        if not isinstance(responses, list) or not set(responses) <= {"code"}:
            return "response_types: only 'code' is supported."
        uris = data.get("redirect_uris", [])
        if isinstance(uris, list) and (len(uris) > self.MAX_REDIRECT_URIS or any(
                isinstance(uri, str) and len(uri) > self.MAX_URI_LENGTH for uri in uris)):
            return (f"redirect_uris: at most {self.MAX_REDIRECT_URIS}, each under {self.MAX_URI_LENGTH} "
                    f"characters.")
        if isinstance(uris, list) and any(
            isinstance(uri, str) and not self.safe_redirect(uri) for uri in uris
        ):
            return ("redirect_uris: use https, or http only to the client's own machine (loopback: "
                    "localhost, 127.0.0.1, [::1]), with no user name or password in it and no backslash.")
        name = data.get("client_name", "")
        if not isinstance(name, str) or len(name) > self.MAX_NAME_LENGTH or any(ord(c) < 32 for c in name):
            return (f"client_name must be text of at most {self.MAX_NAME_LENGTH} characters, without control "
                    f"characters.")
        return ""


    @staticmethod
    def safe_redirect(uri: str) -> bool:
        """No userinfo (`https://trusted.example@evil.example/` reads as the first host and goes to the
        second) and no backslash (which browsers and URL parsers split differently); plain http only to
        loopback."""
        if "\\" in uri:
            return False
        parts = urlsplit(uri)  # other schemes than http are the toolkit's to judge (it allows https only)
        if "@" in parts.netloc:
            return False
        return parts.scheme != "http" or parts.hostname in ("localhost", "127.0.0.1", "::1")


class Registration(throttling.Throttled, OnlyAuthorizationCode, DynamicClientRegistrationView):
    """Open registration (MCP clients register themselves before anyone signs in), limited per address, and
    with at most OAUTH_MAX_PENDING_CLIENTS registrations nobody has authorised yet: beyond that, the oldest
    of them is forgotten, so a flood can neither grow the table nor lock an honest client out."""

    throttle_group = "oauth-register"

    def limit(self):
        return settings.OAUTH_REGISTRATIONS_PER_HOUR, "h"

    def post(self, request, *args, **kwargs):
        response = super().post(request, *args, **kwargs)
        if response.status_code == 201:
            clients.forget_pending_beyond(settings.OAUTH_MAX_PENDING_CLIENTS)
        return response


class Token(throttling.Throttled, TokenView):
    """The token endpoint, limited per address (each request may check a client secret)."""

    throttle_group = "oauth-token"

    def limit(self):
        return settings.OAUTH_TOKEN_REQUESTS_PER_MINUTE, "m"


# Clients register with no cookie and no form: like the toolkit's own views, this takes no CSRF token.
@method_decorator(csrf_exempt, name="dispatch")
class RegistrationManagement(OnlyAuthorizationCode, DynamicClientRegistrationManagementView):
    pass


class AgentAllowForm(AllowForm):
    agent = forms.ChoiceField(label="Act as", required=False, widget=forms.RadioSelect)
    new_agent_name = forms.SlugField(label="New agent's name", max_length=60, required=False)

    def __init__(self, *args, agents=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["agent"].choices = [(a.name, a.name) for a in agents] + [(NEW_AGENT, "A new agent")]
        if agents:
            self.fields["agent"].initial = agents[0].name
        else:
            self.fields["agent"].initial = NEW_AGENT

    def clean(self):
        cleaned = super().clean()
        if not cleaned.get("allow"):
            return cleaned
        if cleaned.get("agent") == NEW_AGENT:
            name = cleaned.get("new_agent_name")
            if not name:
                self.add_error("new_agent_name", "Name the new agent (letters, digits, hyphens).")
            elif Agent.objects.filter(name=name).exists():
                self.add_error("new_agent_name", f"An agent named {name} exists already; pick another name.")
        elif not cleaned.get("agent"):
            self.add_error("agent", "Pick the agent this client acts as.")
        return cleaned


class ConsentView(AuthorizationView):
    """The authorization endpoint's page: which client, for which Recorder, acting as which of your agents."""

    template_name = "journal/oauth_authorize.html"
    form_class = AgentAllowForm

    def get(self, request, *args, **kwargs):
        # The page is never skipped: `approval_prompt=auto` would let a client that was once authorised get a
        # code without the person seeing the page again, naming the agent and where the code goes.
        if "approval_prompt" in request.GET:
            request.GET = request.GET.copy()
            request.GET["approval_prompt"] = "force"
        return super().get(request, *args, **kwargs)

    def get_form_kwargs(self):
        return {**super().get_form_kwargs(), "agents": clients.agents_for(self.request.user)}

    def render_to_response(self, context, **kwargs):
        """The page, whose form may send the browser on to the client's redirect URI (and only there): the
        Content-Security-Policy's `form-action` names that origin, which browsers check on redirects too."""
        response = super().render_to_response(context, **kwargs)
        parts = urlsplit(context.get("redirect_uri", ""))
        if parts.scheme in ("http", "https") and parts.netloc:
            response._csp_update = {"form-action": [f"{parts.scheme}://{parts.netloc}"]}
        return response

    def validate_authorization_request(self, request):
        scopes, credentials = super().validate_authorization_request(request)  # client and redirect_uri first
        recorder = request_recorder_url(request)
        for resource in request.GET.getlist("resource"):
            if clients.canonical_resource(resource) != recorder:
                raise OAuthToolkitError(
                    error=CustomOAuth2Error(
                        error="invalid_target",
                        state=credentials.get("state"),
                        description=f"This server issues tokens for its Recorder, {recorder}, not for "
                                    f"{resource}.",
                    ),
                    redirect_uri=credentials["redirect_uri"],
                )
        return scopes, credentials

    def get_context_data(self, **kwargs):
        context = super().get_context_data(**kwargs)
        if "application" not in context and "form" in context:  # the form shown again, with its errors
            client_id = context["form"].data.get("client_id", "")
            context["application"] = get_application_model().objects.filter(client_id=client_id).first()
        application = context.get("application")
        redirect_uri = _registered_redirect(context.get("form"), application)
        source = getattr(application, "registration_source", "")
        return {**context, "recorder_url": request_recorder_url(self.request), "redirect_uri": redirect_uri,
                "redirect_host": urlsplit(redirect_uri).netloc,
                "self_registered": source == get_application_model().RegistrationSource.DCR}

    def form_valid(self, form):
        """The agent chosen (or created), the client authorised as it, and the code issued, in one
        transaction: a request the toolkit then refuses (a redirect URI or a PKCE challenge tampered with in
        the form) rolls all of it back, so nothing is left behind and no old token ends for it."""
        # Every token is bound to this Recorder (RFC 8707), asked for or not, and to nothing else.
        form.cleaned_data["resource"] = request_recorder_url(self.request)
        if not form.cleaned_data.get("allow"):
            return super().form_valid(form)
        application = get_object_or_404(get_application_model(), client_id=form.cleaned_data["client_id"])
        try:
            with transaction.atomic():
                clients.authorize_client(application=application, user=self.request.user,
                                         agent=self._chosen_agent(form))
                response = super().form_valid(form)
                if not _issued_a_code(response):
                    raise _Refused(response)
        except _Refused as refused:
            return refused.response
        except (clients.ClientRefused, IntegrityError) as refused:
            form.add_error("agent", getattr(refused, "message",
                                            "That agent name was just taken; pick another."))
            return self.form_invalid(form)
        return response

    def _chosen_agent(self, form) -> Agent:
        user = self.request.user
        if form.cleaned_data["agent"] == NEW_AGENT:
            agent, _ = services.create_agent(name=form.cleaned_data["new_agent_name"], on_behalf_of=user)
            if not roles.has_any_role(user, *roles.ALL):  # anyone may make an agent: not email approvers
                Agent.objects.filter(pk=agent.pk).update(asks_approvers=False)
                agent.asks_approvers = False
            return agent
        agent = Agent.objects.filter(
            name=form.cleaned_data["agent"], on_behalf_of=user, is_active=True
        ).first()
        if agent is None:
            raise clients.ClientRefused("Pick one of your own active agents.")
        return agent


def _registered_redirect(form, application) -> str:
    """The redirect URI the form sends the code to, if the client registered it (else "")."""
    uri = (form["redirect_uri"].value() or "") if form is not None and "redirect_uri" in form.fields else ""
    registered = (application.redirect_uris or "").split() if application is not None else []
    return uri if uri in registered else ""


class _Refused(Exception):
    """The toolkit refused the request: what it answered, once the transaction is rolled back."""

    def __init__(self, response):
        super().__init__("the authorization request was refused")
        self.response = response


def _issued_a_code(response) -> bool:
    """Whether the toolkit's answer sends the browser back to the client with an authorization code."""
    query = parse_qs(urlsplit(getattr(response, "url", "") or "").query)
    return "code" in query and "error" not in query


def may_manage(user, agent: Agent) -> bool:
    """The person an agent acts for, and admins, may revoke the clients acting as it."""
    return agent.on_behalf_of_id == user.pk or roles.has_role(user, roles.ADMIN)


@require_POST
def revoke_client(request, name, authorization_id):
    agent = visible_agent(request, name)
    if not may_manage(request.user, agent):
        raise PermissionDenied("Only the person this agent acts for, or an admin, may revoke its clients.")
    authorization = get_object_or_404(ClientAuthorization.objects.select_related("application", "user"),
                                      pk=authorization_id, agent=agent)
    label = authorization.application.name or authorization.application.client_id
    clients.revoke_client(authorization=authorization)
    messages.success(request, f"Revoked {label}: its tokens stop working now, in every Recorder process.")
    return redirect("journal:agent_detail", name=agent.name)
