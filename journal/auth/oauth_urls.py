"""The OAuth endpoints, in the namespace django-oauth-toolkit reverses its own names in: RFC 8414 and RFC 9728
metadata at the root's well-known URLs, the authorization server under /oauth/ (`journal.auth.oauth`)."""

from django.urls import path, re_path
from oauth2_provider import views as toolkit

from . import oauth

app_name = "oauth2_provider"

urlpatterns = [
    path(".well-known/oauth-authorization-server", toolkit.OAuthServerMetadataView.as_view(),
         name="oauth-server-metadata"),
    path(".well-known/oauth-protected-resource", oauth.ProtectedResourceMetadata.as_view(),
         name="oauth-resource-metadata"),
    re_path(r"^\.well-known/oauth-protected-resource/mcp/?$", oauth.ProtectedResourceMetadata.as_view(),
            name="oauth-resource-metadata-recorder"),
    path("oauth/authorize/", oauth.ConsentView.as_view(), name="authorize"),
    path("oauth/token/", oauth.Token.as_view(), name="token"),
    path("oauth/revoke/", toolkit.RevokeTokenView.as_view(), name="revoke-token"),
    path("oauth/register/", oauth.Registration.as_view(), name="dcr-register"),
    path("oauth/register/<str:client_id>/", oauth.RegistrationManagement.as_view(),
         name="dcr-register-management"),
]
