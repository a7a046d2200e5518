"""Tool servers: where each is reached, what it lists, the recipes admins gave its tools, and the prefix its
tools' names carry for agents."""

from functools import cached_property

from django.core.exceptions import ValidationError
from django.db import models
from django.utils import timezone

from ..undo.database.places import NotADatabase, dialect_of, shown_database, without_passwords

SEPARATOR = "__"  # tools are named prefix__tool


class ToolServer(models.Model):
    class Transport(models.TextChoices):
        HTTP = "http", "Streamable HTTP"
        STDIO = "stdio", "stdio"

    name = models.SlugField(max_length=60, unique=True, help_text="Prefix of its tools' names: name__tool.")
    # A shorter prefix agents see instead (alias__tool), for a server whose name__tool names run over the 64
    # characters model APIs take. Calls by either prefix reach it; the record always names the server.
    alias = models.SlugField(max_length=30, blank=True, default="", help_text=(
        "A shorter prefix for its tools' names as agents see them (alias__tool), where name__tool would be "
        "over the 64 characters model APIs accept. Calls named either way reach this server."))
    transport = models.CharField(max_length=10, choices=Transport.choices, default=Transport.HTTP)
    url = models.URLField(blank=True, max_length=500)
    command = models.CharField(
        blank=True, max_length=1000, help_text="For stdio: the command line to start it."
    )
    enabled = models.BooleanField(default=True)
    # The database a database server's SQL tools act on, as the Recorder reaches it with its own credentials
    # (a PostgreSQL URL, or an SQLite file's path): what it reads the statements' tables from before a call,
    # the rows a call changed from after it, and undoes them through (journal.undo.database).
    database = models.CharField(max_length=500, blank=True, default="", help_text=(
        "For a database server: the database its SQL acts on, as the Recorder reaches it with its own "
        "credentials (postgresql://user:password@host/db, or an SQLite file's path)."))
    # The raw `tools/list` JSON, exactly as the server sent it (the SDK's models drop annotations.recovery).
    catalogue = models.JSONField(default=list, blank=True)
    catalogue_fetched_at = models.DateTimeField(null=True, blank=True)
    catalogue_error = models.TextField(blank=True)
    # Receipt keys the server published ({keyId: base64url Ed25519 public key}), pinned on first sight.
    receipt_keys = models.JSONField(default=dict, blank=True)
    # Admins' undo recipes for the tools this server says nothing about (journal.undo.recipes): the recipes in
    # force (raw, one per tool), the pack they came from if any, and who last changed them, when. Written by
    # `services.set_recipes` only; every change is in the policies' change log.
    recipes = models.JSONField(default=list, blank=True)
    recipe_pack = models.CharField(max_length=40, blank=True)
    recipes_changed_by = models.CharField(max_length=150, blank=True)
    recipes_changed_at = models.DateTimeField(null=True, blank=True)
    # The database capture's rows swept so far, and what the sweeps found there that no recorded call's
    # window holds (the latest 50 findings): written by `services.sweep_capture` only.
    capture_swept_to = models.BigIntegerField(default=0)
    unrecorded = models.JSONField(default=list, blank=True)
    # PostgreSQL: the capture's last change id handed out at the last sweep, and the transactions then
    # running (a change id is taken when a row is written, and may be committed long after).
    capture_horizon = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    # Moves with every save; the Recorder compares it to know its copy of the server is still current.
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]
        constraints = [models.UniqueConstraint(fields=["alias"], condition=~models.Q(alias=""),
                                               name="journal_toolserver_alias_unique")]

    def __str__(self):
        return self.name

    @property
    def command_shown(self) -> str:
        """The command line as pages show it: any URL's password in it (a DSN) replaced by ***."""
        return without_passwords(self.command)

    @property
    def database_shown(self) -> str:
        """The database as pages and logs show it: never its password."""
        return shown_database(self.database)

    @property
    def prefix(self) -> str:
        """What its tools' names start with as agents see them: its alias, else its name."""
        return self.alias or self.name

    def clean(self):
        for field in ("name", "alias"):
            if SEPARATOR in getattr(self, field):
                raise ValidationError(
                    {field: f"It cannot contain {SEPARATOR!r}: that separates it from a tool's name."})
        if self.alias and ToolServer.objects.exclude(pk=self.pk).filter(
                models.Q(name=self.alias) | models.Q(alias=self.alias)).exists():
            raise ValidationError(
                {"alias": f"{self.alias!r} is already another tool server's name or alias."})
        if ToolServer.objects.exclude(pk=self.pk).filter(alias=self.name).exists():
            raise ValidationError({"name": f"{self.name!r} is already another tool server's alias."})
        if self.database:
            try:
                dialect_of(self.database)
            except NotADatabase as exc:
                raise ValidationError({"database": str(exc)}) from None
        if self.transport == self.Transport.HTTP and not self.url:
            raise ValidationError({"url": "A streamable HTTP server needs a URL."})
        if self.transport == self.Transport.STDIO and not self.command:
            raise ValidationError({"command": "A stdio server needs a command."})

    def tool(self, name: str) -> dict | None:
        for tool in self.catalogue:
            if isinstance(tool, dict) and tool.get("name") == name:
                return tool
        return None

    @cached_property
    def listed_tool_names(self) -> frozenset[str]:
        """`tool_names`, read once for this row as loaded (the Recorder loads a server again when it
        changes)."""
        return frozenset(self.tool_names)

    @property
    def tool_names(self) -> set[str]:
        return {
            tool["name"]
            for tool in self.catalogue
            if isinstance(tool, dict) and isinstance(tool.get("name"), str)
        }

    def recipe(self, tool: str) -> dict | None:
        """The raw recipe in force for `tool`, if an admin gave it one."""
        return next((r for r in self.recipes if isinstance(r, dict) and r.get("tool") == tool), None)
