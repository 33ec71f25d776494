from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("expenses", "0001_initial")]

    operations = [
        migrations.CreateModel(
            name="BankOutage",
            fields=[
                (
                    "id",
                    models.BigAutoField(
                        auto_created=True, primary_key=True, serialize=False, verbose_name="ID"
                    ),
                ),
                ("payee", models.CharField(max_length=255, unique=True)),
                ("note", models.CharField(blank=True, default="", max_length=255)),
            ],
        ),
    ]
