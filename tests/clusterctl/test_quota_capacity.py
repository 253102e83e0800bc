"""quota (moto EC2 for the running instances, Stubber for Service Quotas: moto only models VPC quotas) and
capacity (Stubber: moto implements neither Capacity Block offerings/purchase nor capacity reservations).
The Stubber validates every request and response against the real service model."""

import datetime
import io

import boto3
import pytest
from botocore.stub import Stubber
from fake_aws import capacity_block_offering

from cluster_aws.errors import EXIT_ACCESS, EXIT_FAILED, EXIT_OK, EXIT_USAGE

UTC = datetime.UTC
QUOTA_PARAMS = {"ServiceCode": "ec2", "QuotaCode": "L-417A185B"}


def quota_response(value):
    return {
        "Quota": {
            "ServiceCode": "ec2",
            "QuotaCode": "L-417A185B",
            "QuotaName": "Running On-Demand P instances",
            "Value": value,
            "Unit": "None",
            "Adjustable": True,
            "GlobalQuota": False,
        }
    }


@pytest.fixture()
def quotas(cli):
    client = boto3.client("service-quotas", region_name="us-east-1")
    cli.context.clients["service-quotas"] = client
    with Stubber(client) as stubber:
        yield stubber
        stubber.assert_no_pending_responses()


def run_instances(instance_type, count, **extra):
    ec2 = boto3.client("ec2", region_name="us-east-1")
    return ec2.run_instances(
        ImageId="ami-12c6146b", MinCount=count, MaxCount=count, InstanceType=instance_type, **extra
    )


def test_quota_does_not_fit_and_says_what_to_ask_for(cli, moto_aws, quotas):
    run_instances("p5.48xlarge", 1)  # 192 vCPUs in use
    run_instances("p3dn.24xlarge", 1)  # not in the catalog: 96 vCPUs from DescribeInstanceTypes
    run_instances("m5.large", 2)  # not a P instance
    stopped = run_instances("p4d.24xlarge", 1)["Instances"][0]["InstanceId"]
    boto3.client("ec2", region_name="us-east-1").stop_instances(InstanceIds=[stopped])
    quotas.add_response("get_service_quota", quota_response(384.0), QUOTA_PARAMS)

    result = cli("quota", "--instance-type", "p5.48xlarge", "--nodes", "4")
    assert result.code == EXIT_FAILED
    assert result.lines == [
        "quota L-417A185B (Running On-Demand P instances): 384 vCPUs",
        "in use: 288 vCPUs",
        "request: 4 x p5.48xlarge = 768 vCPUs (192 per node)",
        "does not fit: 1056 vCPUs needed, 384 allowed",
        "ask for an increase to at least the vCPUs needed: aws service-quotas request-service-quota-increase "
        "--service-code ec2 --quota-code L-417A185B --desired-value 1056",
    ]


def test_quota_fits_with_the_default_when_none_is_applied(cli, moto_aws, quotas):
    quotas.add_client_error(
        "get_service_quota", "NoSuchResourceException", "no applied quota", expected_params=QUOTA_PARAMS
    )
    quotas.add_response("get_aws_default_service_quota", quota_response(1152.0), QUOTA_PARAMS)
    result = cli("quota", "--nodes", "2", "--json")
    assert result.code == EXIT_OK
    assert (
        '"fits": true' in result.out
        and '"neededVcpus": 384' in result.out
        and '"quotaVcpus": 1152' in result.out
    )


def test_quota_rejects_an_unknown_instance_type(cli):
    with pytest.raises(SystemExit) as exit_info:
        cli("quota", "--instance-type", "p9.huge", "--nodes", "1")
    assert exit_info.value.code == EXIT_USAGE


@pytest.fixture()
def ec2_stub(cli):
    client = boto3.client("ec2", region_name="us-east-1")
    cli.context.clients["ec2"] = client
    with Stubber(client) as stubber:
        yield stubber
        stubber.assert_no_pending_responses()


def test_offerings_are_listed_cheapest_first_with_price(cli, ec2_stub):
    ec2_stub.add_response(
        "describe_capacity_block_offerings",
        {
            "CapacityBlockOfferings": [
                capacity_block_offering("cb-0aaaaaaaaaaaaaaa1", "26880.00", start_day=3),
                capacity_block_offering("cb-0bbbbbbbbbbbbbbb2", "21504.00", start_day=5, az="us-east-1b"),
            ]
        },
        {
            "InstanceType": "p5.48xlarge",
            "InstanceCount": 4,
            "CapacityDurationHours": 168,
            "StartDateRange": datetime.datetime(2026, 12, 1, tzinfo=UTC),
            "EndDateRange": datetime.datetime(2026, 12, 20, 12, 0, tzinfo=UTC),
        },
    )
    result = cli(
        "capacity",
        "offerings",
        "--instance-type",
        "p5.48xlarge",
        "--nodes",
        "4",
        "--hours",
        "168",
        "--start",
        "2026-12-01",
        "--end",
        "2026-12-20T12:00:00Z",
    )
    assert result.code == EXIT_OK, result.err
    header, first, second, hint = result.lines
    assert header.split() == [
        "OFFERING",
        "AZ",
        "START",
        "END",
        "HOURS",
        "INSTANCES",
        "UPFRONT",
        "FEE",
        "PER",
        "INSTANCE-HOUR",
    ]
    assert first.split() == [
        "cb-0bbbbbbbbbbbbbbb2",
        "us-east-1b",
        "2026-12-05T11:30:00Z",
        "2026-12-12T11:30:00Z",
        "168",
        "4",
        "$21,504.00",
        "USD",
        "$32.00",
    ]
    assert second.split()[0] == "cb-0aaaaaaaaaaaaaaa1" and second.split()[-1] == "$40.00"
    # the purchase looks the offering up with the same request, to show what it buys
    assert hint == ("buy one with: clusterctl capacity purchase OFFERING --instance-type p5.48xlarge --nodes 4 "
                    "--hours 168 --start 2026-12-01T00:00:00Z --end 2026-12-20T12:00:00Z")


@pytest.mark.parametrize("hours", ["30", "400", "5000"])
def test_offerings_reject_durations_ec2_does_not_sell(cli, ec2_stub, hours):
    result = cli("capacity", "offerings", "--nodes", "4", "--hours", hours)
    assert result.code == EXIT_USAGE
    assert f"--hours={hours}: allowed: whole days" in result.err  # and no request was made


BLOCK = {
    "CapacityReservationId": "cr-0123456789abcdef0",
    "InstanceType": "p5.48xlarge",
    "InstancePlatform": "Linux/UNIX",
    "AvailabilityZone": "us-east-1b",
    "TotalInstanceCount": 4,
    "AvailableInstanceCount": 0,
    "State": "scheduled",
    "ReservationType": "capacity-block",
    "StartDate": datetime.datetime(2026, 12, 5, 11, 30, tzinfo=UTC),
    "EndDate": datetime.datetime(2026, 12, 12, 11, 30, tzinfo=UTC),
}


OFFERING_REQUEST = {"InstanceType": "p5.48xlarge", "InstanceCount": 4, "CapacityDurationHours": 168}
PURCHASE = ("capacity", "purchase", "cb-0bbbbbbbbbbbbbbb2", "--nodes", "4", "--hours", "168")


def expect_offerings(ec2_stub):
    """The purchase's look-up: the offerings of the same request, the one to buy among them."""
    ec2_stub.add_response(
        "describe_capacity_block_offerings",
        {"CapacityBlockOfferings": [
            capacity_block_offering("cb-0aaaaaaaaaaaaaaa1", "26880.00", start_day=3),
            capacity_block_offering("cb-0bbbbbbbbbbbbbbb2", "21504.00", start_day=5, az="us-east-1b"),
        ]},
        OFFERING_REQUEST,
    )


def test_purchase_shows_what_it_buys_and_buys_nothing_without_yes(cli, ec2_stub):
    expect_offerings(ec2_stub)
    cli.reply = "n"
    result = cli(*PURCHASE)
    assert result.code == EXIT_FAILED and result.out.strip() == "not bought"
    # the instance type and count, the AZ, the start and end, the upfront fee
    assert cli.answers == [
        "Buy Capacity Block cb-0bbbbbbbbbbbbbbb2: 4 x p5.48xlarge in us-east-1b, 2026-12-05T11:30:00Z to "
        "2026-12-12T11:30:00Z (168 h), upfront $21,504.00 USD? The fee is charged now and a purchase cannot be "
        "cancelled. Type 'yes' to buy: "
    ]


def test_purchase_with_stdin_closed_is_not_bought(cli, ec2_stub, monkeypatch, capsys):
    expect_offerings(ec2_stub)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # a closed stdin: the real input() meets its end
    cli._confirm = input  # the Runtime's default prompt
    result = cli(*PURCHASE)
    assert (result.code, result.out.strip(), result.err) == (EXIT_FAILED, "not bought", "")
    assert "Buy Capacity Block cb-0bbbbbbbbbbbbbbb2: 4 x p5.48xlarge" in capsys.readouterr().out  # it was asked


@pytest.mark.parametrize("skip_prompt", [False, True])
def test_purchase_prints_the_deploy_settings(cli, ec2_stub, skip_prompt):
    expect_offerings(ec2_stub)
    ec2_stub.add_response(
        "purchase_capacity_block",
        {"CapacityReservation": BLOCK},
        {"CapacityBlockOfferingId": "cb-0bbbbbbbbbbbbbbb2", "InstancePlatform": "Linux/UNIX"},
    )
    result = cli(*PURCHASE, *(["--yes"] if skip_prompt else []))
    assert result.code == EXIT_OK, result.err
    assert len(cli.answers) == (0 if skip_prompt else 1)
    assert result.lines[0] == (
        "bought cr-0123456789abcdef0: 4 x p5.48xlarge in us-east-1b, 2026-12-05T11:30:00Z "
        "to 2026-12-12T11:30:00Z (scheduled), upfront $21,504.00 USD"
    )
    assert result.lines[2] == (
        '  make deploy CDK_ARGS="-c region=us-east-1 -c availabilityZone=us-east-1b '
        "-c instanceType=p5.48xlarge -c nodeCount=4 -c capacityMode=capacity-block "
        "-c capacityReservationId=cr-0123456789abcdef0 -c reservationInstanceCount=4 "
        '-c reservationStartDate=2026-12-05T11:30:00Z -c reservationEndDate=2026-12-12T11:30:00Z"'
    )


def test_a_purchase_the_operator_policy_alone_refuses_names_the_purchaser_policy(cli, ec2_stub):
    expect_offerings(ec2_stub)
    ec2_stub.add_client_error("purchase_capacity_block", "UnauthorizedOperation", "You are not authorized",
                              expected_params={"CapacityBlockOfferingId": "cb-0bbbbbbbbbbbbbbb2",
                                               "InstancePlatform": "Linux/UNIX"})
    result = cli(*PURCHASE, "--yes")
    assert result.code == EXIT_ACCESS
    assert result.err == (
        "clusterctl: error: access denied: PurchaseCapacityBlock: You are not authorized (attach the stack's "
        "capacity purchaser policy, the CapacityPurchaser Policy resource (stack output CapacityPurchaserPolicyArn), "
        "to your role)\n")


@pytest.mark.parametrize("offering_id", ["cr-123", "cb-123", "cb-0bbbbbbbbbbbbbbb2; rm", "CB-0BBBBBBBBBBBBBBB2"])
def test_purchase_rejects_a_malformed_offering_id_before_any_call(cli, ec2_stub, offering_id):
    # the Stubber fails any call it was not told to expect: the id is checked first, with or without --yes
    for yes in ([], ["--yes"]):
        result = cli("capacity", "purchase", offering_id, "--nodes", "4", "--hours", "168", *yes)
        assert result.code == EXIT_USAGE
        assert result.err == (f"clusterctl: error: offering id {offering_id!r}: expected cb-... (cb- and 17 letters "
                              "or digits) from `clusterctl capacity offerings`\n")
    assert cli.answers == []


def test_purchase_of_an_offering_no_longer_listed_buys_nothing(cli, ec2_stub):
    ec2_stub.add_response("describe_capacity_block_offerings",
                          {"CapacityBlockOfferings": [capacity_block_offering("cb-0aaaaaaaaaaaaaaa1", "26880.00")]},
                          OFFERING_REQUEST)
    result = cli(*PURCHASE, "--yes")
    assert result.code == EXIT_FAILED and cli.answers == []
    assert result.err.startswith("clusterctl: error: offering cb-0bbbbbbbbbbbbbbb2: not among the Capacity Block "
                                 "offerings for 4 x p5.48xlarge for 168 h in us-east-1 now ")


def test_capacity_list_shows_blocks_and_odcrs(cli, ec2_stub):
    odcr = {
        "CapacityReservationId": "cr-0fedcba9876543210",
        "InstanceType": "p5.48xlarge",
        "InstancePlatform": "Linux/UNIX",
        "AvailabilityZone": "us-east-1a",
        "TotalInstanceCount": 2,
        "AvailableInstanceCount": 1,
        "State": "active",
        "ReservationType": "default",
        "StartDate": datetime.datetime(2026, 11, 1, tzinfo=UTC),
    }
    ec2_stub.add_response("describe_capacity_reservations", {"CapacityReservations": [odcr, BLOCK]}, {})
    result = cli("capacity", "list")
    assert result.code == EXIT_OK, result.err
    assert result.lines[1].split() == [
        "cr-0123456789abcdef0",
        "capacity-block",
        "p5.48xlarge",
        "us-east-1b",
        "scheduled",
        "0/4",
        "2026-12-05T11:30:00Z",
        "2026-12-12T11:30:00Z",
    ]
    assert result.lines[2].split()[:6] == [
        "cr-0fedcba9876543210",
        "odcr",
        "p5.48xlarge",
        "us-east-1a",
        "active",
        "1/2",
    ]
    assert result.lines[2].endswith("no end")
