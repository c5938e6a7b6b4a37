"""``autotune init``: a deployment, a search space and a study from what runs today.

A team that wants autotune already runs its servers: a command line, a systemd unit, a
compose service, a Kubernetes workload. ``autotune init`` reads that
(:func:`autotune.init.importer.import_services`), types every option with the engine's own
parser, keeps credentials out of the files, proposes the levers the engine's catalog knows to
matter around today's values, and writes the three files ``autotune run`` needs
(:func:`autotune.init.writer.write`), whose baseline is exactly what runs now.

The package imports nothing on its own: ``autotune --help`` must not pay for it.
"""
