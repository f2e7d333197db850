"""The file ``spark-submit`` runs (it takes Python applications as ``.py`` files):
``cmdare-collector``'s commands, under Spark's master, jars and configuration.

    spark-submit --master spark://head:7077 --jars ... \\
        "$(python -c 'import cmdare.collector.cli.submit as m; print(m.__file__)')" \\
        maintain --engine spark --lake s3://... --catalog postgresql+psycopg2://...
"""

if __name__ == "__main__":
    from cmdare.collector.cli import cli

    cli(prog_name="cmdare-collector")
