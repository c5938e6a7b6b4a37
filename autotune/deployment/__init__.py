"""Deployments: which services run, how they start, where they answer (``launchers/*.yaml``).

A deployment file is the command lines as the team runs them today, without the levers
the search space tunes; :func:`autotune.render.render` adds those per trial. Strings may
use templates, checked when the file is loaded:

* ``${python}``: the interpreter running autotune; ``${deployment}``: the deployment name;
  ``${run_dir}``: the run directory (logs, state); ``${model}``: the ``model`` field;
  ``${deployment_dir}``: the directory holding the deployment file, on this machine (paths
  that travel with a project checkout: its engine environments, a model built beside it);
* in a service: ``${service}``, ``${host}``, ``${port}`` of that service, and
  ``${ports.NAME}`` for each of its extra ports (``ports: {NAME: PORT}``);
* anywhere: ``${NAME.host}`` / ``${NAME.port}`` / ``${NAME.ports.EXTRA}`` of service NAME;
* ``${env:VAR}``: the variable ``VAR`` of the environment autotune runs in, read when the
  services are rendered (a credential: ``HF_TOKEN: "${env:HF_TOKEN}"``, ``--api-key
  "${env:AUTOTUNE_SECRET_API_KEY}"``), so the file never holds it; unset, rendering fails and
  names it (``autotune init`` writes secrets this way);
* ``$${`` is a literal ``${``.

``port: auto`` picks a free port once per :class:`Deployment` object (one tuning session),
so fingerprints, and therefore "restart only what changed", stay stable across trials. A
service's extra ports (``ports: {bootstrap: auto}``: a second listener, such as SGLang's
``--disaggregation-bootstrap-port`` or the router's ``--prometheus-port``) are fixed or
``auto`` the same way, so two deployments on one machine never share one.


This package is the facade: import from ``autotune.deployment``. Its private modules split
one file's life by concept: the models and what one deployment object works out
(:mod:`._model`: fields, ports, run directory, template values), the cross-field checks
that pydantic cannot see (:mod:`._checks`: references, roles, ports, templates, URLs), and
reading a file or finding one by name (:mod:`._loading`). Expanding templates
(:mod:`autotune.templates`), rendering (:mod:`autotune.render`) and the hosts model
(:mod:`autotune.hosts`) are modules of their own.
"""

from __future__ import annotations

from autotune.deployment._loading import (
    BUNDLED_DIR,
    available_deployments,
    load_deployment,
    parse_deployment,
)
from autotune.deployment._model import PORT_AUTO, Deployment, HealthCheck, ServiceDef

__all__ = [
    "BUNDLED_DIR",
    "PORT_AUTO",
    "Deployment",
    "HealthCheck",
    "ServiceDef",
    "available_deployments",
    "load_deployment",
    "parse_deployment",
]
