"""The toolkit's OAuth2 validator, with one rule it lacks: an authorization code exchanged twice has leaked,
and every token it gave ends (RFC 6749 section 4.1.2). The toolkit deletes a code once it is exchanged, so
a replay looks like any unknown code; `services.clients` remembers exchanged codes (their digests) to tell."""

from oauth2_provider.oauth2_validators import OAuth2Validator

from ..services import clients


class RecorderValidator(OAuth2Validator):
    def save_bearer_token(self, token, request, *args, **kwargs):
        super().save_bearer_token(token, request, *args, **kwargs)
        if request.grant_type == "authorization_code" and token.get("access_token"):
            clients.code_redeemed(code=request.code, application=request.client,
                                  access_token=token["access_token"])

    def validate_code(self, client_id, code, client, request, *args, **kwargs):
        if super().validate_code(client_id, code, client, request, *args, **kwargs):
            return True
        clients.code_replayed(code=code, application=client)
        return False
