//! Streaming one request's events, built on submit/step/cancel. This
//! module sits above `session`: it adds [`Session::stream`] there, so the
//! session module never names a stream.

use crate::error::{Error, Result, Status};
use crate::model::Token;
use crate::params::RequestParams;
use crate::session::{Event, RequestId, Session};
use std::collections::VecDeque;

/// The events of one request, in order, as an iterator; each `next()`
/// steps the session as needed. Events of other requests stepped on the
/// way are kept for the session's next [`Session::step`]. An `Err` item
/// (an interrupted step, say) does not end the stream: calling `next()`
/// again repeats the step. Dropping the stream before its end cancels the
/// request.
pub struct Stream<'s> {
    session: &'s mut Session,
    id: RequestId,
    finishes_left: u32,
    queue: VecDeque<Event>,
}

impl Session {
    /// Submits a request and streams its events; see [`Stream`].
    pub fn stream(&mut self, prompt: &[Token], params: &RequestParams) -> Result<Stream<'_>> {
        let id = self.submit(prompt, params)?;
        Ok(Stream::new(self, id, params.samples()))
    }
}

impl<'s> Stream<'s> {
    fn new(session: &'s mut Session, id: RequestId, samples: u32) -> Stream<'s> {
        Stream {
            session,
            id,
            finishes_left: samples,
            queue: VecDeque::new(),
        }
    }

    pub fn request_id(&self) -> RequestId {
        self.id
    }

    /// Cancels the request; the stream then ends with a
    /// [`FinishReason::Cancelled`](crate::FinishReason::Cancelled) event.
    pub fn cancel(&self) -> Result<()> {
        self.session.cancel(self.id)
    }

    pub fn is_finished(&self) -> bool {
        self.finishes_left == 0 && self.queue.is_empty()
    }

    /// Runs the stream to its end and returns the text of sample 0.
    pub fn text(self) -> Result<String> {
        let mut text = String::new();
        for event in self {
            let event = event?;
            if event.sample_index == 0 {
                text.push_str(&event.text);
            }
        }
        Ok(text)
    }
}

impl<'s> Iterator for Stream<'s> {
    type Item = Result<Event>;

    fn next(&mut self) -> Option<Result<Event>> {
        loop {
            if let Some(event) = self.queue.pop_front() {
                if event.finish.is_some() {
                    self.finishes_left = self.finishes_left.saturating_sub(1);
                }
                return Some(Ok(event));
            }
            if self.finishes_left == 0 {
                return None;
            }
            let events = match self.session.step_native() {
                Ok(events) => events,
                Err(err) => return Some(Err(err)),
            };
            if events.is_empty() {
                // A prompt chunk gives no event; an idle session means the
                // request is gone and would never finish.
                match self.session.stats() {
                    Ok(stats) if stats.n_running == 0 && stats.n_waiting == 0 => {
                        self.finishes_left = 0;
                        return Some(Err(Error::new(
                            Status::Internal,
                            "the session went idle before the request finished",
                        )));
                    }
                    Ok(_) => {}
                    Err(err) => return Some(Err(err)),
                }
            }
            for event in events {
                if event.request == self.id {
                    self.queue.push_back(event);
                } else {
                    self.session.pending.push_back(event);
                }
            }
        }
    }
}

impl<'s> Drop for Stream<'s> {
    fn drop(&mut self) {
        // Finish events already queued here were delivered: fewer are to come.
        let queued = self.queue.iter().filter(|e| e.finish.is_some()).count() as u32;
        let to_come = self.finishes_left.saturating_sub(queued);
        if to_come > 0 && self.session.cancel(self.id).is_ok() {
            self.session.discarded.insert(self.id, to_come);
        }
    }
}
