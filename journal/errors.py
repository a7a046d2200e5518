"""The one base of every refusal in the project: a request that cannot be taken as asked.

`message` is in words for the person (or agent) who asked; views show it as it is. Subclasses add only what
their callers decide on (`PlanRefused.open_plan`, `PolicyRefused.problems`).
"""


class Refused(Exception):
    def __init__(self, message: str):
        super().__init__(message)
        self.message = message
