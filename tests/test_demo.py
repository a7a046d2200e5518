"""The demo on any port: the site's public URL (the passkeys' origin, the emails' links) follows DEMO_PORT
unless PUBLIC_URL is given."""

from approver import demo


def test_the_public_url_follows_the_demo_port():
    environ = {}
    assert demo.public_url(environ, port=8080) == "http://localhost:8080" == environ["PUBLIC_URL"]


def test_a_public_url_given_is_kept():
    environ = {"PUBLIC_URL": "https://undo.example"}
    assert demo.public_url(environ, port=8080) == "https://undo.example"
