//! `gpuwarden node`, `slot` and `profile`: what the controller knows of the nodes, the slot
//! types and the learned workload profiles.

use gpuwarden_proto::v1 as pb;

use crate::{CliError, Client, NodeCommand, ProfileCommand, SlotCommand, json, print_json, render};

/// `node ls` and `node show`.
pub(crate) async fn node(
    client: &mut Client,
    command: NodeCommand,
    as_json: bool,
) -> Result<(), CliError> {
    match command {
        NodeCommand::Ls => {
            let nodes = client
                .list_nodes(pb::ListNodesRequest::default())
                .await?
                .into_inner()
                .nodes;
            if as_json {
                print_json(&nodes.iter().map(json::Node::from).collect::<Vec<_>>());
            } else {
                print!("{}", render::nodes(&nodes));
            }
        }
        NodeCommand::Show { node } => {
            let n = client
                .get_node(pb::GetNodeRequest {
                    node_id: node.clone(),
                })
                .await?
                .into_inner();
            let map = client
                .get_allocation_map(pb::GetAllocationMapRequest {
                    node_id: node,
                    ..Default::default()
                })
                .await?
                .into_inner();
            let devices = map
                .nodes
                .into_iter()
                .next()
                .map(|m| m.devices)
                .unwrap_or_default();
            if as_json {
                print_json(&json::NodeDetail::new(&n, &devices));
            } else {
                print!("{}", render::node(&n, &devices));
            }
        }
    }
    Ok(())
}

/// `slot ls`.
pub(crate) async fn slot(
    client: &mut Client,
    command: SlotCommand,
    as_json: bool,
) -> Result<(), CliError> {
    match command {
        SlotCommand::Ls => {
            let types = client
                .list_slot_types(pb::ListSlotTypesRequest {})
                .await?
                .into_inner()
                .slot_types;
            if as_json {
                print_json(&types.iter().map(json::SlotType::from).collect::<Vec<_>>());
            } else {
                print!("{}", render::slot_types(&types));
            }
        }
    }
    Ok(())
}

/// `profile ls` and `profile show`.
pub(crate) async fn profile(
    client: &mut Client,
    command: ProfileCommand,
    as_json: bool,
) -> Result<(), CliError> {
    match command {
        ProfileCommand::Ls => {
            let profiles = client
                .list_profiles(pb::ListProfilesRequest::default())
                .await?
                .into_inner()
                .profiles;
            if as_json {
                print_json(&profiles.iter().map(json::Profile::from).collect::<Vec<_>>());
            } else {
                print!("{}", render::profiles(&profiles));
            }
        }
        ProfileCommand::Show { class } => {
            let p = client
                .get_profile(pb::GetProfileRequest { class })
                .await?
                .into_inner();
            if as_json {
                print_json(&json::Profile::from(&p));
            } else {
                print!("{}", render::profile(&p));
            }
        }
    }
    Ok(())
}
