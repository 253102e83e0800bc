"""tests/keeper_calls.py, the reader of a package's AWS calls that holds the job keeper's role to its code, on
small packages written here: what it finds, what it leaves out, and what it refuses to guess."""

import textwrap

import pytest
from keeper_calls import UnreadableCall, aws_calls

SERVICES = ("dynamodb", "ssm", "ec2")


def calls_of(tmp_path, **sources):
    """aws_calls over packages `entry` and `lib` written from `sources` ({"entry/main": "code", ...})."""
    for name, code in sources.items():
        path = tmp_path / f"{name}.py"
        path.parent.mkdir(parents=True, exist_ok=True)
        (path.parent / "__init__.py").touch()
        path.write_text(textwrap.dedent(code))
    found = aws_calls(packages=("entry", "lib"), entry="entry", services=SERVICES, root=tmp_path)
    return {action: sorted(sites) for action, sites in found.items()}


LIB = """
    class Table:
        def __init__(self, dynamodb):
            self.dynamodb = dynamodb

        def get(self, key):
            return self.dynamodb.get_item(TableName="t", Key=key)

        def listing(self):
            return list(self.dynamodb.get_paginator("scan").paginate(TableName="t"))

        @property
        def newest(self):
            return self.dynamodb.query(TableName="t")


    def find(ssm):
        return ssm.list_commands()


    def unused(ssm):
        return ssm.delete_document(Name="x")
"""


def test_only_what_the_entry_reaches_counts_through_functions_methods_properties_and_paginators(tmp_path):
    found = calls_of(tmp_path, **{"lib/table": LIB, "entry/main": """
        from lib.table import Table, find

        def run(clients):
            table = Table(clients.dynamodb)
            table.get({})
            table.listing()
            print(table.newest)
            find(clients.ssm)
            clients.ec2.describe_instances()
    """})
    assert found == {
        "dynamodb:GetItem": ["lib/table.py:7"],
        "dynamodb:Scan": ["lib/table.py:10"],  # a paginator calls its operation
        "dynamodb:Query": ["lib/table.py:14"],  # read through a property
        "ssm:ListCommands": ["lib/table.py:18"],
        "ec2:DescribeInstances": ["entry/main.py:10"],
    }  # and never ssm:DeleteDocument: `unused` is not reached


def test_a_transaction_is_each_of_its_item_actions(tmp_path):
    found = calls_of(tmp_path, **{"lib/table": "", "entry/main": """
        def create(dynamodb):
            dynamodb.transact_write_items(TransactItems=[
                {"Put": {"TableName": "t", "Item": {}}},
                {"ConditionCheck": {"TableName": "t", "Key": {}, "ConditionExpression": "x"}},
            ])
    """})
    assert found == {"dynamodb:PutItem": ["entry/main.py:3"], "dynamodb:ConditionCheckItem": ["entry/main.py:3"]}


@pytest.mark.parametrize(("code", "refusal"), [
    ("def f(db):\n    db.get_item(TableName='t', Key={})\n",
     "entry/main.py:2: db.get_item(...) looks like a dynamodb call on a client named 'db': name the client after its "
     "service"),
    ("def f(dynamodb, items):\n    dynamodb.transact_write_items(TransactItems=items)\n",
     "entry/main.py:2: transact_write_items needs TransactItems as a literal list of dicts"),
    ("def f(dynamodb, op):\n    dynamodb.get_paginator(op)\n",
     "entry/main.py:2: dynamodb.get_paginator needs the operation as a literal"),
    ("def f(dynamodb):\n    dynamodb.batch_write_item(RequestItems={})\n",
     "entry/main.py:2: dynamodb.batch_write_item: its IAM actions depend on its arguments"),
    ("def f(ssm):\n    ssm.send_commands()\n", "entry/main.py:2: ssm.send_commands is not an operation of ssm"),
])
def test_what_it_cannot_read_it_refuses_in_one_line(tmp_path, code, refusal):
    with pytest.raises(UnreadableCall) as error:
        calls_of(tmp_path, **{"lib/table": "", "entry/main": code})
    assert str(error.value).startswith(refusal)
