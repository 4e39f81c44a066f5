//! Admin of topics: create, alter, delete, list, describe.

use super::{Engine, Topic};
use crate::error::{AppendError, CommitError, IoError, OpenError, TopicError};
use crate::groups::{self, CommitKey, OFFSETS_TOPIC};
use crate::io::Io;
use crate::layout::{CREATING_SUFFIX, DELETING_SUFFIX, fsync_directory, remove_tree};
use crate::log::Durability;
use crate::partition::{Partition, PartitionDescription};
use crate::segment;
use crate::sync::Mutex;
use crate::topic::{self, TOPIC_META_FILE, TopicConfig};
use crate::{Offset, Record};
use std::sync::Arc;

/// A topic as [`Engine::describe_topic`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TopicDescription {
    pub name: String,
    pub config: TopicConfig,
    pub partitions: Vec<PartitionDescription>,
}

impl<I: Io> Engine<I> {
    /// Create a topic. Crash-safe: the topic is built in a hidden directory, fsynced, and
    /// renamed into place; a crash before the rename leaves nothing behind after the next open.
    /// Names starting with `__` are reserved for internal topics. A topic of this name kept
    /// closed by damage ([`Engine::damaged_topics`]) is refused with its `Corruption`: its
    /// files are still there.
    pub fn create_topic(&self, name: &str, config: TopicConfig) -> Result<(), TopicError> {
        if groups::is_internal(name) {
            let reason = "names starting with \"__\" are reserved for internal topics";
            return Err(TopicError::InvalidName { name: name.to_owned(), reason });
        }
        // Before forgetting commits: the damaged topic's are still its own.
        if let Some(damage) = self.damage_of(name) {
            return Err(TopicError::Corruption(damage));
        }
        if self.topic(name).is_none() {
            // A topic of this name deleted before (and a crash before its records were
            // forgotten): its transactions' ends must not speak for the new one.
            self.forget_commits(name).map_err(|e| self.as_topic_error(e, name))?;
        }
        self.create_any_topic(name, config)
    }

    /// Tombstone every commit record of `topic` in `__consumer_offsets` (transactions' and
    /// groups' offsets), durably, so a topic created again under the name inherits none.
    fn forget_commits(&self, topic: &str) -> Result<(), CommitError> {
        let mut committed = self.inner.committed.lock();
        let keys = committed.keys_of_topic(topic);
        if keys.is_empty() {
            return Ok(());
        }
        let encoded: Vec<Vec<u8>> = keys.iter().map(CommitKey::encode).collect();
        let records: Vec<Record<'_>> = encoded.iter().map(|k| Record::new(Some(k), b"")).collect();
        self.append(OFFSETS_TOPIC, 0, &records)?;
        if self.inner.options.durability != Durability::Sync {
            self.partition_for_append(OFFSETS_TOPIC, 0)?.flush()?;
        }
        for key in &keys {
            committed.remove(key);
        }
        Ok(())
    }

    pub(super) fn create_any_topic(
        &self,
        name: &str,
        config: TopicConfig,
    ) -> Result<(), TopicError> {
        self.check_writable()?;
        topic::validate_name(name)?;
        config.validate()?;
        self.inner.context.poison.check()?;
        let _admin = self.inner.admin.lock();
        if self.inner.topics.read().contains_key(name) {
            return Err(TopicError::AlreadyExists { name: name.to_owned() });
        }
        // A damaged topic's directory is still in place: never build another over it.
        if let Some(damage) = self.damage_of(name) {
            return Err(TopicError::Corruption(damage));
        }
        let io = self.io();
        let topics_directory = self.topics_directory();
        let staging = topics_directory.join(format!(".{name}{CREATING_SUFFIX}"));
        let final_path = topics_directory.join(name);
        let result = (|| {
            if io.list(&staging).is_ok() {
                remove_tree(io, &staging)?;
            }
            io.create_directory(&staging).map_err(|e| IoError::new("mkdir", &staging, e))?;
            segment::write_file_durably(io, &staging.join(TOPIC_META_FILE), config.encode())?;
            for id in 0..config.partitions {
                Partition::<I>::create_files(io, &staging.join(id.to_string()))?;
            }
            fsync_directory(io, &staging)?;
            io.rename(&staging, &final_path).map_err(|e| IoError::new("rename", &staging, e))?;
            if crate::canary::active(crate::canary::Canary::TopicCreateNotDurable) {
                return Ok(());
            }
            fsync_directory(io, &topics_directory)
        })();
        result
            .inspect_err(|e| self.inner.context.poison.set(format!("create topic {name}: {e}")))?;
        let mut partitions = Vec::with_capacity(config.partitions as usize);
        for id in 0..config.partitions {
            let directory = final_path.join(id.to_string());
            // The topic is in place on disk but not yet in memory: a failure here poisons
            // too (found by the simulator), and the next open finds the topic whole.
            let context = &self.inner.context;
            let (partition, _) =
                Partition::open(context, directory, name, id, config, Offset::ZERO)
                    .inspect_err(|e| {
                        self.inner.context.poison.set(format!("create topic {name}: {e}"));
                    })
                    .map_err(|e| match e {
                        OpenError::Io(e) => TopicError::Io(e),
                        OpenError::Corruption(c) => TopicError::Corruption(c),
                        other => TopicError::Io(IoError::new(
                            "open new partition",
                            &self.inner.root,
                            std::io::Error::other(other.to_string()),
                        )),
                    })?;
            partitions.push(partition);
        }
        let topic = Topic { config: Mutex::new(config), partitions };
        self.inner.topics.write().insert(name.to_owned(), Arc::new(topic));
        Ok(())
    }

    /// Change an existing topic's settings; every one but `partitions` may change. Durable
    /// when it returns: `topic.meta` is replaced through a temporary file and a rename, and
    /// the topic directory fsynced. A crash leaves the old settings or the new ones. New
    /// settings apply from the next append (segment size and age), the next roll (index
    /// interval) and the next [`Engine::tick`] (retention).
    ///
    /// On a topic kept closed because its `topic.meta` is damaged or missing
    /// ([`Engine::damaged_topics`]), this is the repair: `config` is written as its new
    /// `topic.meta` and the topic is opened (recovered) and usable at once. `partitions`
    /// must equal the partition directories found (`0` to `partitions - 1`); the other
    /// settings are the caller's to know. A topic closed by damage elsewhere is refused with
    /// that `Corruption`.
    pub fn alter_topic_config(&self, name: &str, config: TopicConfig) -> Result<(), TopicError> {
        self.check_writable()?;
        config.validate()?;
        self.inner.context.poison.check()?;
        if self.topic(name).is_none() && self.damage_of(name).is_some() {
            return self.repair_topic(name, config);
        }
        let _admin = self.inner.admin.lock();
        let topic = self.existing_topic(name)?;
        let current = *topic.config.lock();
        if config.partitions != current.partitions {
            return Err(TopicError::InvalidConfig {
                reason: format!(
                    "the partition count of an existing topic cannot change (it has {})",
                    current.partitions
                ),
            });
        }
        let io = self.io();
        let directory = self.topics_directory().join(name);
        let result =
            segment::write_file_durably(io, &directory.join(TOPIC_META_FILE), config.encode())
                .and_then(|()| fsync_directory(io, &directory));
        result.inspect_err(|e| {
            self.inner.context.poison.set(format!("alter topic {name}: {e}"));
        })?;
        *topic.config.lock() = config;
        for partition in &topic.partitions {
            partition.set_config(config);
        }
        Ok(())
    }

    /// `alter_topic_config` on a topic kept closed by damage: write `topic.meta` anew and open
    /// the topic.
    fn repair_topic(&self, name: &str, config: TopicConfig) -> Result<(), TopicError> {
        // In the order commits take them (the offsets topic is created holding both).
        let mut committed = self.inner.committed.lock();
        let admin = self.inner.admin.lock();
        let Some(damage) = self.damage_of(name) else {
            // Repaired or deleted meanwhile: an ordinary alter now.
            drop((admin, committed));
            return self.alter_topic_config(name, config);
        };
        let io = self.io();
        let directory = self.topics_directory().join(name);
        let meta_path = directory.join(TOPIC_META_FILE);
        if damage.file != meta_path {
            // Settings cannot mend a damaged segment or log start.
            return Err(TopicError::Corruption(damage));
        }
        let listed = io.list(&directory).map_err(|e| IoError::new("list", &directory, e))?;
        let mut found: Vec<Option<u32>> = listed
            .iter()
            .filter(|e| e.is_directory)
            .map(|e| e.name.parse().ok().filter(|id: &u32| id.to_string() == e.name))
            .collect();
        found.sort_unstable();
        let expected: Vec<Option<u32>> = (0..config.partitions).map(Some).collect();
        if found != expected {
            let found = found.len();
            return Err(TopicError::InvalidConfig {
                reason: format!(
                    "the damaged topic {name:?} holds {found} partition directories, and the \
                     config must name exactly those (0 to n - 1) to repair it"
                ),
            });
        }
        let result = segment::write_file_durably(io, &meta_path, config.encode())
            .and_then(|()| fsync_directory(io, &directory));
        result.inspect_err(|e| {
            self.inner.context.poison.set(format!("repair topic {name}: {e}"));
        })?;
        tracing::warn!(topic = name, "topic.meta rewritten over damage; opening the topic");
        let mut partitions: Vec<Arc<Partition<I>>> = Vec::new();
        for id in 0..config.partitions {
            let transaction_end = committed.transaction_end(name, id);
            let context = &self.inner.context;
            let opened = Partition::open(
                context,
                directory.join(id.to_string()),
                name,
                id,
                config,
                transaction_end,
            );
            match opened {
                Ok((partition, _)) => partitions.push(partition),
                Err(error) => {
                    for partition in &partitions {
                        partition.mark_deleted();
                    }
                    return Err(match error {
                        OpenError::Corruption(damage) => {
                            // Still closed, now by damage the new settings do not mend.
                            self.inner.damaged.write().insert(name.to_owned(), damage.clone());
                            TopicError::Corruption(damage)
                        }
                        OpenError::Io(e) => {
                            self.inner.context.poison.set(format!("repair topic {name}: {e}"));
                            TopicError::Io(e)
                        }
                        other => TopicError::Io(IoError::new(
                            "open repaired partition",
                            &directory,
                            std::io::Error::other(other.to_string()),
                        )),
                    });
                }
            }
        }
        if name == OFFSETS_TOPIC {
            let first = partitions.first().expect("the offsets topic has a partition");
            *committed = Self::load_committed(first, &directory)?;
        }
        let topic = Topic { config: Mutex::new(config), partitions };
        // Into `topics` before out of `damaged`: a lookup meanwhile finds one or the other.
        self.inner.topics.write().insert(name.to_owned(), Arc::new(topic));
        self.inner.damaged.write().remove(name);
        Ok(())
    }

    /// Delete a topic and all its data. Crash-safe: the directory is first renamed to a hidden
    /// name (durably), then removed; a crash in between is finished at the next open.
    ///
    /// A topic kept closed by damage ([`Engine::damaged_topics`]) is deleted the same way,
    /// with every file in its directory: the remedy when its data is not wanted back (put
    /// the damaged file back from a backup instead to keep it).
    pub fn delete_topic(&self, name: &str) -> Result<(), TopicError> {
        if groups::is_internal(name) {
            let reason = "internal topics cannot be deleted";
            return Err(TopicError::InvalidName { name: name.to_owned(), reason });
        }
        self.check_writable()?;
        self.inner.context.poison.check()?;
        let _admin = self.inner.admin.lock();
        let removed = self.inner.topics.write().remove(name);
        if let Some(removed) = removed {
            // No append may roll a segment into the directory about to be renamed.
            for partition in &removed.partitions {
                partition.mark_deleted();
            }
        } else if self.inner.damaged.write().remove(name).is_none() {
            return Err(TopicError::NotFound { name: name.to_owned() });
        }
        let io = self.io();
        let topics_directory = self.topics_directory();
        let doomed = topics_directory.join(format!(".{name}{DELETING_SUFFIX}"));
        let result = (|| {
            io.rename(&topics_directory.join(name), &doomed)
                .map_err(|e| IoError::new("rename", &doomed, e))?;
            fsync_directory(io, &topics_directory)?;
            remove_tree(io, &doomed)?;
            fsync_directory(io, &topics_directory)
        })();
        result
            .inspect_err(|e| self.inner.context.poison.set(format!("delete topic {name}: {e}")))?;
        // Housekeeping (a create of the same name does it too, should this one not happen).
        self.forget_commits(name).map_err(|e| self.as_topic_error(e, name))
    }

    /// A commit error met while managing topic `name`.
    fn as_topic_error(&self, error: CommitError, name: &str) -> TopicError {
        match error {
            CommitError::Topic(e) => e,
            CommitError::Append(AppendError::Io(e)) => TopicError::Io(e),
            CommitError::Append(AppendError::Poisoned(p)) => TopicError::Poisoned(p),
            // `__consumer_offsets` damaged at the end of its log takes no tombstone.
            CommitError::Append(AppendError::Corruption(c)) => TopicError::Corruption(c),
            other => TopicError::Io(IoError::new(
                "forget transactions",
                &self.topics_directory().join(name),
                std::io::Error::other(other.to_string()),
            )),
        }
    }

    /// Names of all topics but the internal ones (`__consumer_offsets`), sorted; also those
    /// kept closed by damage ([`Engine::damaged_topics`]), whose operations report it.
    pub fn list_topics(&self) -> Vec<String> {
        let mut names: Vec<String> = self.inner.topics.read().keys().cloned().collect();
        names.extend(self.inner.damaged.read().keys().cloned());
        names.retain(|t| !groups::is_internal(t));
        names.sort();
        names.dedup();
        names
    }

    /// A topic's settings and partitions; `Corruption` for a topic kept closed by damage.
    pub fn describe_topic(&self, name: &str) -> Result<TopicDescription, TopicError> {
        let topic = self.existing_topic(name)?;
        let partitions = topic.partitions.iter().map(|p| p.describe()).collect();
        let config = *topic.config.lock();
        Ok(TopicDescription { name: name.to_owned(), config, partitions })
    }

    /// The number of partitions of a topic: `NotFound`, or `Corruption` for a topic kept
    /// closed by damage (its count may be unknown).
    pub fn topic_partitions(&self, name: &str) -> Result<u32, TopicError> {
        Ok(self.existing_topic(name)?.config.lock().partitions)
    }

    /// The number of partitions of a topic; `None` also for a topic kept closed by damage
    /// (its count may be unknown): [`Engine::topic_partitions`] tells the two apart.
    pub fn partition_count(&self, topic: &str) -> Option<u32> {
        self.topic(topic).map(|t| t.config.lock().partitions)
    }
}
