"""The data layer's error for one patient's files (its one home: the CSV reader and the
patient-plan reader both raise it)."""

from __future__ import annotations

import os

from provided_code.errors import UserError


class PatientDataError(UserError, ValueError):
    """A patient's files are missing or malformed. The message names patient, file and problem."""

    def __init__(self, patient_id: str, path: os.PathLike | str, problem: str):
        self.patient_id = patient_id
        self.path = str(path)
        self.problem = problem
        super().__init__(f"Patient {patient_id}: {self.path}: {problem}")

    def __reduce__(self):  # survive the trip back from a worker process
        return type(self), (self.patient_id, self.path, self.problem)
