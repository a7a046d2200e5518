from django.core.management.base import BaseCommand

from journal.record import keys


class Command(BaseCommand):
    help = "Add a new Recorder signing key. Old public keys stay, so old checkpoints still verify."

    def handle(self, **options):
        key = keys.create_key()
        self.stdout.write(f"New signing key {key.key_id}; private key in {keys.settings.RECORDER_KEY_DIR}.")
