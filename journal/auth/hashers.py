"""How OAuth client secrets are kept: salted SHA-256, not a password hash.

A password hash is slow on purpose (PBKDF2 here costs about a third of a second of CPU), because people pick
guessable passwords. A client secret is 128 random characters the toolkit generates (a client never picks its
own), so nobody can guess one however fast the hash, and the slowness bought only a way for anyone to burn
the Recorder's CPU: every registration of a confidential client and every wrong secret at the token endpoint
paid it. Secrets kept under the old hasher still verify (PBKDF2 stays listed in PASSWORD_HASHERS); people's
passwords keep the default hasher, which comes first.
"""

import hashlib

from django.contrib.auth.hashers import BasePasswordHasher, mask_hash, must_update_salt
from django.utils.crypto import constant_time_compare


class ClientSecretHasher(BasePasswordHasher):
    algorithm = "sha256-client-secret"

    def encode(self, password, salt):
        self._check_encode_args(password, salt)
        digest = hashlib.sha256((salt + password).encode()).hexdigest()
        return f"{self.algorithm}${salt}${digest}"

    def decode(self, encoded):
        algorithm, salt, digest = encoded.split("$", 2)
        assert algorithm == self.algorithm
        return {"algorithm": algorithm, "hash": digest, "salt": salt}

    def verify(self, password, encoded):
        return constant_time_compare(encoded, self.encode(password, self.decode(encoded)["salt"]))

    def safe_summary(self, encoded):
        decoded = self.decode(encoded)
        return {"algorithm": decoded["algorithm"], "salt": mask_hash(decoded["salt"], show=2),
                "hash": mask_hash(decoded["hash"])}

    def must_update(self, encoded):
        return must_update_salt(self.decode(encoded)["salt"], self.salt_entropy)

    def harden_runtime(self, password, encoded):
        pass  # nothing to even out: every secret costs the same
