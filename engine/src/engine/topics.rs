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
    /// Names starting with `__` are reserved for internal topics.
    pub fn create_topic(&self, name: &str, config: TopicConfig) -> Result<(), TopicError> {
        if groups::is_internal(name) {
            let reason = "names starting with \"__\" are reserved for internal topics";
            return Err(TopicError::InvalidName { name: name.to_owned(), reason });
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
    pub fn alter_topic_config(&self, name: &str, config: TopicConfig) -> Result<(), TopicError> {
        self.check_writable()?;
        config.validate()?;
        self.inner.context.poison.check()?;
        let _admin = self.inner.admin.lock();
        let topic =
            self.topic(name).ok_or_else(|| TopicError::NotFound { name: name.to_owned() })?;
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

    /// Delete a topic and all its data. Crash-safe: the directory is first renamed to a hidden
    /// name (durably), then removed; a crash in between is finished at the next open.
    pub fn delete_topic(&self, name: &str) -> Result<(), TopicError> {
        if groups::is_internal(name) {
            let reason = "internal topics cannot be deleted";
            return Err(TopicError::InvalidName { name: name.to_owned(), reason });
        }
        self.check_writable()?;
        self.inner.context.poison.check()?;
        let _admin = self.inner.admin.lock();
        let Some(removed) = self.inner.topics.write().remove(name) else {
            return Err(TopicError::NotFound { name: name.to_owned() });
        };
        // No append may roll a segment into the directory about to be renamed.
        for partition in &removed.partitions {
            partition.mark_deleted();
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
            other => TopicError::Io(IoError::new(
                "forget transactions",
                &self.topics_directory().join(name),
                std::io::Error::other(other.to_string()),
            )),
        }
    }

    /// Names of all topics but the internal ones (`__consumer_offsets`), sorted.
    pub fn list_topics(&self) -> Vec<String> {
        self.inner.topics.read().keys().filter(|t| !groups::is_internal(t)).cloned().collect()
    }

    pub fn describe_topic(&self, name: &str) -> Result<TopicDescription, TopicError> {
        let topic =
            self.topic(name).ok_or_else(|| TopicError::NotFound { name: name.to_owned() })?;
        let partitions = topic.partitions.iter().map(|p| p.describe()).collect();
        let config = *topic.config.lock();
        Ok(TopicDescription { name: name.to_owned(), config, partitions })
    }

    /// The number of partitions of a topic.
    pub fn partition_count(&self, topic: &str) -> Option<u32> {
        self.topic(topic).map(|t| t.config.lock().partitions)
    }
}
